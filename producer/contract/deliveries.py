"""Webhook deliveries: the arq job a worker queues once a job with a webhook is terminal."""

from __future__ import annotations

import secrets
import time
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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
    waits: int = 0  # times put off because its tenant had its cap of deliveries in flight


class DeadLetter(BaseModel):
    """A delivery that was given up, with the reason; it can be replayed.

    A body over the worker's cap is not copied: ``body_in_job`` says the job record's result
    (the same bytes) is the body, so replay works as long as the job's result is kept.
    """

    delivery: Delivery  # its body is "" when body_in_job
    body_in_job: bool = False
    error: ErrorInfo
    status_code: int | None = None
    attempts: int
    failed_at: float
    expires_at: float | None = None  # gone from the list after this


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


# ---------------------------------------------------------------------------- dead letters


# Add one dead letter, then drop the tenant's letters older than the TTL and the oldest over
# the count limit, atomically. KEYS: letters hash, order zset.
# ARGV: webhook_id, letter JSON, now, ttl (s), max letters. Returns how many were dropped.
LUA_ADD_DEAD_LETTER = """
local now, ttl, max = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now, ARGV[1])
local drop = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. tostring(now - ttl))
local extra = redis.call('ZCARD', KEYS[2]) - #drop - max
if extra > 0 then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], #drop, #drop + extra - 1)) do
    drop[#drop + 1] = id
  end
end
for _, id in ipairs(drop) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return #drop
"""


# ---------------------------------------------------------------------------- redaction


def _masked_query(query: str) -> str:
    pairs = (p.partition("=") for p in query.split("&") if p)
    return "&".join(f"{k}=***" if eq else "***" for k, eq, _ in pairs)


def mask_webhook_url(url: str) -> str:
    """``url`` fit for logs and API answers: credentials and query values masked, no fragment.

    ``https://user:pw@host/h?token=abc`` → ``https://***@host/h?token=***``.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a malformed port)
    except ValueError:
        return "<invalid url>"
    _userinfo, at, hostport = parts.netloc.rpartition("@")
    netloc = f"***@{hostport}" if at else hostport
    return urlunsplit((parts.scheme, netloc, parts.path, _masked_query(parts.query), ""))
