"""Webhook dead letters, seen from the producer side: list a tenant's, replay one.

Workers write a dead letter when they give up a delivery (``workers.webhooks``); replaying
queues the same delivery again (same ``webhook-id``, same body, attempt 1) and clears a
disabled endpoint's mark, since asking for a replay says the receiver is back.
"""

from __future__ import annotations

import time
from typing import Any

from ..contract import DeadLetter, DeliveryState, Keys, add_delivery
from ..errors import Conflict, NotFound


async def list_dead_letters(redis: Any, keys: Keys, tenant: str, limit: int = 100) -> list[DeadLetter]:
    """The tenant's dead letters, most recent first."""
    raw = await redis.hvals(keys.dead_letters(tenant))
    letters = [DeadLetter.model_validate_json(v) for v in raw]
    letters.sort(key=lambda d: d.failed_at, reverse=True)
    return letters[:limit]


async def job_delivery(redis: Any, keys: Keys, job_id: str) -> dict[str, str] | None:
    """A job's webhook delivery state, or ``None`` if it has no webhook (yet)."""
    state: dict[str, str] = await redis.hgetall(keys.webhook(job_id))
    return state or None


async def replay(redis: Any, keys: Keys, tenant: str, webhook_id: str) -> DeadLetter:
    """Queue a dead letter's delivery again and remove it from the list."""
    key = keys.dead_letters(tenant)
    raw = await redis.hget(key, webhook_id)
    if raw is None:
        raise NotFound(f"no dead letter {webhook_id!r}", code="dead_letter_not_found")
    letter = DeadLetter.model_validate_json(raw)
    delivery = letter.delivery.model_copy(update={"attempt": 1})
    if await redis.hget(keys.webhook(delivery.job_id), "state") == DeliveryState.delivered:
        raise Conflict("this webhook was delivered since; not sending it again", code="already_delivered")
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hdel(key, webhook_id)
        pipe.hdel(keys.disabled_endpoints(), delivery.url)
        pipe.hset(
            keys.webhook(delivery.job_id),
            mapping={"state": DeliveryState.pending.value, "attempts": 0, "updated_at": time.time()},
        )
        add_delivery(pipe, keys, delivery)
        await pipe.execute()
    return letter
