"""Scaling: the worker's batch window (max_wait_ms × max_batch) and 1 vs 2 worker processes."""

from __future__ import annotations

from typing import Any

from . import load
from .context import Context
from .harness import FIXED, models_env
from .stats import ratio, reps_summary


async def sweep_point(ctx: Context, wait_ms: float, batch: int) -> dict[str, Any]:
    h, s = ctx.harness, ctx.sizes
    h.stop_workers()
    prefix = f"bench-sweep-{batch}-{wait_ms:g}"
    h.start_worker(prefix, OVERSPILL_MODELS=models_env({"max_wait_ms": wait_ms, "max_batch": batch}))
    async with ctx.client(prefix) as client:
        await load.closed_loop(client, FIXED, min(256, s.sweep_items), s.users, timeout_s=s.timeout_s)
        runs = [
            await load.closed_loop(client, FIXED, s.sweep_items, s.users, timeout_s=s.timeout_s)
            for _ in range(s.reps)
        ]
    h.flush()
    return {"max_wait_ms": wait_ms, "max_batch": batch, **reps_summary(runs)}


async def workers_scaling(ctx: Context, count: int) -> dict[str, Any]:
    h, s = ctx.harness, ctx.sizes
    h.stop_workers()
    prefix = f"bench-scale-{count}"
    for _ in range(count):
        h.start_worker(prefix)
    async with ctx.client(prefix) as client:
        await load.closed_loop(client, FIXED, min(256, s.interactive_items), s.users, timeout_s=s.timeout_s)
        inter = [
            await load.closed_loop(client, FIXED, s.interactive_items, s.users, timeout_s=s.timeout_s)
            for _ in range(s.reps)
        ]
        bulk = [
            await load.bulk(client, FIXED, s.bulk_items_fixed, timeout_s=s.timeout_s) for _ in range(s.reps)
        ]
    h.flush()
    h.stop_workers()
    return {"workers": count, "interactive": reps_summary(inter), "bulk": reps_summary(bulk)}


async def sweep(ctx: Context) -> None:
    s = ctx.sizes
    points = [await sweep_point(ctx, w, b) for b in s.sweep_batches for w in s.sweep_waits_ms]
    one, two = await workers_scaling(ctx, 1), await workers_scaling(ctx, 2)
    ctx.details["sweep"] = {"points": points, "workers": [one, two]}
    ctx.headline["sweep_best_items_per_s"] = max(p["items_per_s"] for p in points)
    ctx.headline["workers_2_vs_1_interactive"] = ratio(
        two["interactive"]["items_per_s"], one["interactive"]["items_per_s"]
    )
    ctx.headline["workers_2_vs_1_bulk"] = ratio(two["bulk"]["items_per_s"], one["bulk"]["items_per_s"])
