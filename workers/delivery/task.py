"""The delivery queue's arq side: the ``deliver_webhook`` function and the Worker serving it."""

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
    """The arq function named ``producer.contract.WEBHOOK_TASK``."""
    webhooks: Webhooks = ctx["webhooks"]
    structlog.contextvars.clear_contextvars()
    try:
        delivery = Delivery.model_validate(payload)
    except ValidationError as exc:
        log.error("malformed webhook delivery", error=str(exc)[:200])
        return "malformed"
    structlog.contextvars.bind_contextvars(job_id=delivery.job_id, webhook_id=delivery.webhook_id)
    try:
        outcome = await webhooks.run(delivery)
    except RedisError as exc:
        # Raised as is, arq would record the delivery as failed and drop it once Redis answers
        # again: it runs again instead (at least once, with the same webhook-id).
        log.warning("redis lost mid-delivery; it runs again", error=repr(exc)[:200])
        raise RetryJob() from exc
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    return outcome


def build_webhook_worker(keys: Keys, webhooks: Webhooks, redis_settings: RedisSettings) -> Worker:
    """The arq Worker serving the delivery queue; runs beside the lane workers."""
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
        poll_delay=s.webhook_poll_delay_s,
        keep_result=0,
        max_tries=3,
        job_serializer=pack_job,
        job_deserializer=unpack_job,
        log_results=False,
        health_check_interval=5,
    )
