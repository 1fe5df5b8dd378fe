"""Fair share between tenants within a lane: the keys, the enqueue step, the load per tenant.

Each lane keeps, beside arq's queue (every package not finished), a line per tenant and the
tenants in turn (``fair_claim.lua``): a worker's claim serves the tenant with the least
service so far, weighted by its ``share`` from the tenants file, and skips a tenant at its cap
of items in flight. docs/scheduling.md describes the policy and what it promises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .keys import Keys
from .kinds import Lane
from .scripts import LUA_FAIR_ENQUEUE, SLICE_MS


def share_value(share: float, max_in_flight: int | None) -> str:
    """A tenant's entry in the shares hash, as ``fair_claim.lua`` reads it."""
    return f"{share:g}|{max_in_flight if max_in_flight is not None else ''}"


_last_order = 0


def next_order() -> int:
    """A new package's place in its tenant's line: the time in µs, rising strictly within a
    process, so packages queued in one millisecond keep their order (an exact double)."""
    global _last_order
    _last_order = max(time.time_ns() // 1000, _last_order + 1)
    return _last_order


def line_up(
    pipe: Any,
    keys: Keys,
    lane: Lane | str,
    package_id: str,
    *,
    tenant: str,
    items: int,
    order_us: int,
    run_at_ms: int,
) -> None:
    """Add a package to its tenant's line (or the lane's deferred set) on ``pipe``.

    ``order_us`` places it in the line: its first enqueue time in µs (:func:`next_order`), so a
    package queued again after a time-out, a drain or a deferred retry goes back to its place,
    not to the end (a crash split takes a new one: docs/scheduling.md).
    """
    now_ms = int(time.time() * 1000)
    # EVAL, not EVALSHA: a script missing after a Redis restart cannot half-apply a MULTI.
    pipe.eval(
        LUA_FAIR_ENQUEUE, 0, keys.fair(lane), package_id, tenant, max(items, 1), order_us, run_at_ms, now_ms
    )


@dataclass
class TenantLoad:
    """One tenant's work in one lane."""

    tenant: str
    lane: str
    queued_items: int = 0
    items_in_flight: int = 0
    items_served: int = 0  # since the lane's keys were made (a counter)
    items_per_s: float = 0.0  # over the last complete slices
    oldest_wait_s: float | None = None


def _ints(raw: dict[Any, Any]) -> dict[str, int]:
    return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}


async def read_tenant_load(redis: Any, keys: Keys, *, slices: int = 3) -> list[TenantLoad]:
    """Every tenant with work queued, in flight or served lately, per lane: two round trips."""
    now_ms = time.time() * 1000
    last = int(now_ms // SLICE_MS) - 1  # the slice under way is not complete
    async with redis.pipeline(transaction=False) as pipe:
        for lane in Lane:
            f = keys.fair(lane)
            pipe.hgetall(f + "queued")
            pipe.hgetall(f + "inflight")
            pipe.hgetall(f + "served")
            for s in range(last - slices + 1, last + 1):
                pipe.hgetall(f"{f}s:{s}")
        raw = await pipe.execute()
    rows: list[TenantLoad] = []
    step = 3 + slices
    for n, lane in enumerate(Lane):
        queued, inflight, served = (_ints(r) for r in raw[n * step : n * step + 3])
        recent: dict[str, int] = {}
        for r in raw[n * step + 3 : (n + 1) * step]:
            for tenant, v in _ints(r).items():
                recent[tenant] = recent.get(tenant, 0) + v
        for tenant in sorted(set(queued) | set(inflight) | set(recent)):
            rows.append(
                TenantLoad(
                    tenant=tenant,
                    lane=lane.value,
                    queued_items=max(queued.get(tenant, 0), 0),
                    items_in_flight=max(inflight.get(tenant, 0), 0),
                    items_served=served.get(tenant, 0),
                    items_per_s=round(recent.get(tenant, 0) / (slices * SLICE_MS / 1000), 1),
                )
            )
    waiting = [r for r in rows if r.queued_items > 0]
    if waiting:
        async with redis.pipeline(transaction=False) as pipe:
            for r in waiting:
                pipe.zrange(f"{keys.fair(r.lane)}t:{r.tenant}", 0, 0, withscores=True)
            heads = await pipe.execute()
        for r, head in zip(waiting, heads, strict=True):
            if head:
                r.oldest_wait_s = round(max(now_ms - float(head[0][1]) / 1000, 0.0) / 1000, 1)
    return rows
