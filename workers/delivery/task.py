"""The arq queue of deliveries queued before the outbox: its Worker moves each into the outbox.

Producers (API processes, workers) from before the outbox queued each delivery as an arq job on
``Keys.webhooks()``; during a rolling upgrade some may still do. Nothing is lost: this Worker
takes each such job and puts its delivery in the outbox, where the delivery loop sends it."""

from __future__ import annotations

from typing import Any

import structlog
from arq.connections import RedisSettings
from arq.worker import RetryJob, Worker, func
from pydantic import ValidationError
from redis.exceptions import RedisError

from producer.contract import WEBHOOK_TASK, Delivery, Keys, get_logger, pack_job, unpack_job

from ..core.metrics import WEBHOOK_DELIVERIES
from ..queue.worker import PackageWorker
from .webhooks import Webhooks

log = get_logger("workers.delivery.task")


async def deliver_webhook(ctx: dict[str, Any], payload: dict[str, Any]) -> str:
    """The arq function named ``producer.contract.WEBHOOK_TASK``: the delivery into the outbox."""
    webhooks: Webhooks = ctx["webhooks"]
    structlog.contextvars.clear_contextvars()
    try:
        delivery = Delivery.model_validate(payload)
    except ValidationError as exc:
        log.error("malformed webhook delivery", error=str(exc)[:200])
        return "malformed"
    structlog.contextvars.bind_contextvars(job_id=delivery.job_id, webhook_id=delivery.webhook_id)
    try:
        outcome = await webhooks.adopt(delivery)
    except RedisError as exc:
        # Raised as is, arq would record the job as failed and drop it once Redis answers again.
        log.warning("redis lost while adopting a delivery; it runs again", error=repr(exc)[:200])
        raise RetryJob() from exc
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    return outcome


def build_webhook_worker(keys: Keys, webhooks: Webhooks, redis_settings: RedisSettings) -> Worker:
    """The arq Worker serving the old delivery queue; runs beside the lane workers."""
    s = webhooks.settings
    task = func(
        deliver_webhook, name=WEBHOOK_TASK, timeout=s.webhook_timeout_s + 30, keep_result=0, max_tries=3
    )
    return PackageWorker(
        functions=[task],
        queue_name=keys.webhooks(),
        redis_settings=redis_settings,
        ctx={"webhooks": webhooks},
        handle_signals=False,
        max_jobs=s.webhook_max_jobs,
        poll_delay=1.0,  # woken when one is queued; only producers from before the outbox queue here
        keep_result=0,
        max_tries=3,
        job_serializer=pack_job,
        job_deserializer=unpack_job,
        log_results=False,
        health_check_interval=5,
    )
