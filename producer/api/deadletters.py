"""Webhook dead letters, seen from the producer side: list a tenant's, replay one.

Workers write a dead letter when they give up a delivery (``workers.delivery.webhooks``); replaying
queues the same delivery again (same ``webhook-id``, same body, attempt 1) and clears a
disabled endpoint's mark, since asking for a replay says the receiver is back. A letter whose
body was too large to copy (``body_in_job``) is rebuilt from the job's result, the same bytes,
so it can be replayed while the job's result is kept (``OVERSPILL_RESULT_TTL_S``).
"""

from __future__ import annotations

import time
from typing import Any

from ..contract import DeadLetter, DeliveryState, Keys, add_delivery, unpacked_json
from ..contract.deliveries import mask_webhook_url
from ..errors import ApiError, Conflict, NotFound


class Gone(ApiError):
    status = 410
    type = "not_found_error"


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _expired(letter: DeadLetter, now: float) -> bool:
    return letter.expires_at is not None and letter.expires_at <= now


def _shown(letter: DeadLetter) -> DeadLetter:
    """The letter as the API shows it: its URL without credentials or query values."""
    delivery = letter.delivery.model_copy(update={"url": mask_webhook_url(letter.delivery.url)})
    return letter.model_copy(update={"delivery": delivery})


async def list_dead_letters(redis: Any, keys: Keys, tenant: str, limit: int = 100) -> list[DeadLetter]:
    """The tenant's dead letters, most recent first, URLs redacted; expired ones are left out."""
    raw = await redis.hvals(keys.dead_letters(tenant))
    now = time.time()
    letters = [letter for v in raw if not _expired(letter := DeadLetter.model_validate_json(v), now)]
    letters.sort(key=lambda d: d.failed_at, reverse=True)
    return [_shown(d) for d in letters[:limit]]


async def job_delivery(redis: Any, keys: Keys, job_id: str) -> dict[str, str] | None:
    """A job's webhook delivery state, or ``None`` if it has no webhook (yet)."""
    state: dict[str, str] = await redis.hgetall(keys.webhook(job_id))
    return state or None


async def letter_body(redis: Any, keys: Keys, letter: DeadLetter) -> str:
    """The body to send again: the letter's own, or the job's result it refers to."""
    if not letter.body_in_job:
        return letter.delivery.body
    tenant, result = await redis.hmget(keys.job(letter.delivery.job_id), ["tenant", "result"])
    if result is None or _text(tenant) != letter.delivery.tenant:
        raise Gone(
            "the job's result has expired, and this dead letter was too large to keep a copy of it",
            code="result_expired",
        )
    return unpacked_json(str(_text(result)))  # floats, if the job's caller asked for them


async def replay(redis: Any, keys: Keys, tenant: str, webhook_id: str) -> DeadLetter:
    """Queue a dead letter's delivery again and remove it from the list."""
    key = keys.dead_letters(tenant)
    raw = await redis.hget(key, webhook_id)
    if raw is None:
        raise NotFound(f"no dead letter {webhook_id!r}", code="dead_letter_not_found")
    letter = DeadLetter.model_validate_json(raw)
    if _expired(letter, time.time()):
        raise NotFound(f"no dead letter {webhook_id!r} (expired)", code="dead_letter_not_found")
    if _text(await redis.hget(keys.webhook(letter.delivery.job_id), "state")) == DeliveryState.delivered:
        raise Conflict("this webhook was delivered since; not sending it again", code="already_delivered")
    body = await letter_body(redis, keys, letter)
    delivery = letter.delivery.model_copy(update={"attempt": 1, "waits": 0, "body": body})
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hdel(key, webhook_id)
        pipe.zrem(keys.dead_letter_order(tenant), webhook_id)
        pipe.hdel(keys.disabled_endpoints(), delivery.url)
        pipe.hset(
            keys.webhook(delivery.job_id),
            mapping={"state": DeliveryState.pending.value, "attempts": 0, "updated_at": time.time()},
        )
        add_delivery(pipe, keys, delivery)
        await pipe.execute()
    return letter
