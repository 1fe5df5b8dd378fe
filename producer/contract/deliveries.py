"""Webhook deliveries: what a worker puts in the outbox once a job with a webhook is terminal."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict

from .envelope import ErrorInfo
from .keys import Keys
from .wire import wake_channel

# After a job is terminal the worker puts one delivery in the outbox (``Keys.outbox()``): a line
# per tenant, so that a worker claims the deliveries of many tenants in one script call and one
# tenant's backlog never stands in front of another's. The delivery carries the envelope exactly
# as it is signed, so every attempt sends the same bytes under the same ``webhook-id``. A claimed
# delivery stays in its line, scored with the end of its lease: a worker killed mid-delivery
# leaves it to be claimed again when the lease ends (at least once, same ``webhook-id``).

# The arq task name of deliveries queued by producers from before the outbox (Keys.webhooks()).
WEBHOOK_TASK = "deliver_webhook"


class DeliveryState(StrEnum):
    pending = "pending"  # queued, first attempt not made yet
    retrying = "retrying"  # an attempt failed, another is scheduled
    delivered = "delivered"  # the receiver answered 2xx: never sent again
    dead = "dead"  # given up: in the tenant's dead-letter list


class Delivery(BaseModel):
    """One webhook delivery, as the outbox holds it."""

    model_config = ConfigDict(extra="forbid")

    webhook_id: str
    job_id: str
    tenant: str
    url: str
    secret_id: str | None = None
    body: str  # the JobResult envelope JSON, signed as is
    attempt: int = 1
    waits: int = 0  # read from deliveries queued before the outbox; no longer used


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


def add_delivery(
    pipe: Any, keys: Keys, delivery: Delivery, *, defer_s: float = 0.0, wake: bool = True
) -> str:
    """Put a delivery (or its next attempt) in its tenant's outbox line, due in ``defer_s``;
    ``wake`` (one due now): tell the workers' delivery loops (a batch tells them once)."""
    box = keys.outbox()
    due_ms = int((time.time() + defer_s) * 1000)
    pipe.hset(box + "data", delivery.webhook_id, delivery.model_dump_json())
    pipe.zadd(box + "t:" + delivery.tenant, {delivery.webhook_id: due_ms})
    pipe.zadd(box + "tenants", {delivery.tenant: due_ms}, lt=True)  # the line's earliest, kept
    if wake and not defer_s:
        pipe.publish(wake_channel(box), "")
    return delivery.webhook_id


def remove_delivery(pipe: Any, keys: Keys, delivery: Delivery) -> None:
    """Take a delivered or dead-lettered delivery out of the outbox."""
    box = keys.outbox()
    pipe.zrem(box + "t:" + delivery.tenant, delivery.webhook_id)
    pipe.hdel(box + "data", delivery.webhook_id)


# Claim due deliveries, tenant after tenant in the order their lines came due, at most ARGV[5]
# of one tenant and ARGV[4] in all, skipping the tenants named after ARGV[5] (a worker's own
# backlog of them is full). A claimed delivery stays in its line, scored with its lease's end.
# KEYS: none (one outbox, named by its prefix). ARGV: prefix, now ms, lease ms, max, per tenant,
# tenants to skip... Returns webhook_id, Delivery JSON, webhook_id, ...
LUA_OUTBOX_CLAIM = """
local box, now, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local total, per = tonumber(ARGV[4]), tonumber(ARGV[5])
local skip = {}
for i = 6, #ARGV do skip[ARGV[i]] = true end
local out, n = {}, 0
for _, tenant in ipairs(redis.call('ZRANGEBYSCORE', box .. 'tenants', '-inf', now, 'LIMIT', 0, 256)) do
  if n >= total then break end
  if not skip[tenant] then
    local line = box .. 't:' .. tenant
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', line, '-inf', now, 'LIMIT', 0, math.min(per, total - n))) do
      local data = redis.call('HGET', box .. 'data', id)
      if data then
        redis.call('ZADD', line, now + lease, id)
        out[#out + 1] = id
        out[#out + 1] = data
        n = n + 1
      else
        redis.call('ZREM', line, id)
      end
    end
    local head = redis.call('ZRANGE', line, 0, 0, 'WITHSCORES')
    if #head == 0 then
      redis.call('ZREM', box .. 'tenants', tenant)
    else
      redis.call('ZADD', box .. 'tenants', head[2], tenant)
    end
  end
end
return out
"""


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
