"""Webhook deliveries: the arq job a worker queues once a job with a webhook is terminal."""

from __future__ import annotations

import secrets
import time
from enum import StrEnum
from typing import Any

from arq.constants import job_key_prefix
from arq.jobs import serialize_job
from pydantic import BaseModel, ConfigDict

from .envelope import ErrorInfo
from .keys import Keys
from .wire import ARQ_EXPIRY_GRACE_MS, pack_job, wake_channel

# After a job is terminal the worker queues one delivery (an arq job on ``Keys.webhooks()``).
# The delivery carries the envelope exactly as it is signed, so every attempt sends the same
# bytes under the same ``webhook-id``.

WEBHOOK_TASK = "deliver_webhook"


class DeliveryState(StrEnum):
    pending = "pending"  # queued, first attempt not made yet
    retrying = "retrying"  # an attempt failed, another is scheduled
    delivered = "delivered"  # the receiver answered 2xx: never sent again
    dead = "dead"  # given up: in the tenant's dead-letter list


class Delivery(BaseModel):
    """One webhook delivery: the payload of a ``deliver_webhook`` arq job."""

    model_config = ConfigDict(extra="forbid")

    webhook_id: str
    job_id: str
    tenant: str
    url: str
    secret_id: str | None = None
    body: str  # the JobResult envelope JSON, signed as is
    attempt: int = 1


class DeadLetter(BaseModel):
    """A delivery that was given up, with the reason; it can be replayed."""

    delivery: Delivery
    error: ErrorInfo
    status_code: int | None = None
    attempts: int
    failed_at: float


def webhook_id_for(job_id: str) -> str:
    """The ``webhook-id`` of a job's callback: stable across attempts and replays."""
    return "msg_" + job_id.removeprefix("job_")


def add_delivery(pipe: Any, keys: Keys, delivery: Delivery, *, defer_s: float = 0.0) -> str:
    """Queue a webhook delivery on a Redis pipeline (arq's job format, msgpack)."""
    arq_id = "wh_" + secrets.token_hex(12)
    run_at_ms = int((time.time() + defer_s) * 1000)
    payload = delivery.model_dump(mode="json")
    data = serialize_job(WEBHOOK_TASK, (payload,), {}, None, run_at_ms, serializer=pack_job)
    pipe.psetex(job_key_prefix + arq_id, int(defer_s * 1000) + ARQ_EXPIRY_GRACE_MS, data)
    pipe.zadd(keys.webhooks(), {arq_id: run_at_ms})
    if not defer_s:
        pipe.publish(wake_channel(keys.webhooks()), "")
    return arq_id
