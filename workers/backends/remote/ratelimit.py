"""Provider limits shared by every worker: one Lua script on Redis (``ratelimit.lua``).

Per remote: requests/min and tokens/min as GCRA token buckets, and a cap on requests in flight
(leases that expire, so a killed worker's slots come back). A 429 halves the shared rate (down
to ``floor``) and its ``Retry-After`` holds every worker back; the rate then grows back to the
configured one over ``recover_s``. Tokens are charged by estimate before a call and corrected
with the provider's reported usage after it.

With ``burst`` 1, requests are spaced at least 60/rpm seconds apart, so any one-second window
sees at most rpm/60 requests granted (plus the network's reordering on the way).
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from producer.contract import get_logger

from ...core.errors import RemoteUnavailable
from ...core.metrics import PROVIDER_RATE_FACTOR, PROVIDER_WAITS

log = get_logger(__name__)

LUA_RATELIMIT = (Path(__file__).parent / "ratelimit.lua").read_text()
MAX_SLEEP_S = 1.0  # re-ask at least this often: another worker's release may free a slot sooner


class ProviderLimits(BaseModel):
    """What the provider allows, for all workers together (0: no limit)."""

    model_config = ConfigDict(extra="forbid")

    requests_per_min: float = Field(default=0, ge=0)
    tokens_per_min: float = Field(default=0, ge=0)
    concurrency: int = Field(default=0, ge=0)
    burst: float = Field(default=1, ge=1)  # requests that may go back to back
    recover_s: float = Field(default=30.0, ge=0)  # after a 429, back to the full rate in this long
    floor: float = Field(default=0.1, gt=0, le=1)  # a 429 never cuts the rate below this share
    lease_s: float = Field(default=120.0, gt=0)  # a slot in flight is freed after this at most

    @property
    def limited(self) -> bool:
        return bool(self.requests_per_min or self.tokens_per_min or self.concurrency)


def estimate_tokens(endpoint: str, payload: dict[str, Any]) -> int:
    """Tokens a request will cost, before it is sent: about 4 characters a token, plus the
    completion budget for chat (what providers count against tokens/min)."""
    if endpoint == "embeddings":
        inputs = payload.get("input")
        texts = inputs if isinstance(inputs, list) else [inputs or ""]
        return sum(len(str(t)) for t in texts) // 4 + len(texts)
    if endpoint == "chat/completions":
        chars = sum(len(str(m.get("content", ""))) for m in payload.get("messages", []))
        return chars // 4 + int(payload.get("max_tokens") or 0) + 4
    docs = payload.get("documents") or []
    return (len(str(payload.get("query", ""))) * len(docs) + sum(len(str(d)) for d in docs)) // 4


def reported_tokens(data: Any) -> int | None:
    """Tokens the provider says a call used (``usage.total_tokens``), if it says."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    return sum(p for p in parts if isinstance(p, int)) or None


class Lease:
    def __init__(self, lease_id: str, estimate: int) -> None:
        self.id = lease_id
        self.estimate = estimate


class SharedLimiter:
    """One remote's limits in Redis; every worker that calls that remote uses the same keys."""

    def __init__(self, redis: Any, root: str, provider: str, limits: ProviderLimits) -> None:
        self.provider = provider
        self.limits = limits
        self._redis = redis
        self._script = redis.register_script(LUA_RATELIMIT)
        self._keys = [f"{root}:provider:{provider}:limits", f"{root}:provider:{provider}:leases"]
        self._factor = PROVIDER_RATE_FACTOR.labels(provider)
        self._rng = random.Random()

    async def _call(self, *args: Any) -> tuple[bool, float, float]:
        granted, wait, factor = await self._script(keys=self._keys, args=list(args))
        self._factor.set(float(factor))
        return bool(int(granted)), float(wait), float(factor)

    async def acquire(self, estimate: int, *, give_up_at: float | None = None) -> Lease:
        """Wait for the provider's room for one request of about ``estimate`` tokens."""
        lease = Lease(secrets.token_hex(8), estimate)
        lim = self.limits
        waited = False
        while True:
            granted, wait, _ = await self._call(
                "acquire", lim.requests_per_min, lim.tokens_per_min, lim.concurrency, lim.burst,
                estimate, lease.id, lim.lease_s, lim.recover_s, lim.floor,
            )  # fmt: skip
            if granted:
                return lease
            if not waited:
                PROVIDER_WAITS.labels(self.provider).inc()
                waited = True
            if give_up_at is not None and time.time() + wait > give_up_at:
                raise RemoteUnavailable(
                    f"remote {self.provider}: its rate limit leaves no room before the job's deadline"
                )
            # A little jitter, so workers that waited for the same instant do not ask together.
            await asyncio.sleep(min(wait, MAX_SLEEP_S) + self._rng.uniform(0, 0.005))

    async def release(self, lease: Lease, actual_tokens: int | None) -> None:
        """Free the request's slot and charge what it really cost."""
        delta = 0 if actual_tokens is None else actual_tokens - lease.estimate
        lim = self.limits
        await self._call("release", lease.id, lim.tokens_per_min, delta, lim.recover_s, lim.floor)

    async def penalise(self, retry_after_s: float) -> float:
        """A 429: every worker holds back ``retry_after_s`` and the shared rate halves."""
        _, _, factor = await self._call("penalise", retry_after_s, self.limits.recover_s, self.limits.floor)
        log.warning(
            "remote rate limited; shared rate cut",
            provider=self.provider,
            factor=round(factor, 3),
            hold_s=retry_after_s,
        )
        return factor

    async def state(self) -> dict[str, str]:
        """The shared state as stored (for tests and operators)."""
        raw = await self._redis.hgetall(self._keys[0])
        return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
