"""P3: submit→result latency at 10/50/90 % of P2 capacity, against direct single calls."""

from __future__ import annotations

from typing import Any

from . import load
from .context import Context
from .direct import SingleCalls
from .harness import EMBED, FIXED, TRITON_NAME
from .stats import Run, ratio
from .throughput import capacity

WARMUP_S = 1.0  # open-loop load at the same rate before the clock starts (not recorded)


async def overspill_at(ctx: Context, model: str, rate: float) -> dict[str, Any]:
    """Open-loop single-item jobs at ``rate``: the run's summary, CPU and items per package."""
    s = ctx.sizes
    ctx.main_worker()
    n = int(rate * s.latency_seconds) + 1
    async with ctx.client() as client:
        warmup = load.overspill_call(client, model, int(rate * WARMUP_S) + 1, timeout_s=s.timeout_s)
        await load.open_loop(warmup, rate, WARMUP_S, timeout_s=s.timeout_s)
        call = load.overspill_call(client, model, n, timeout_s=s.timeout_s)
        with ctx.cpu() as meter, ctx.packing() as packing:
            run = await load.open_loop(call, rate, s.latency_seconds, timeout_s=s.timeout_s)
    ctx.harness.flush()
    return {**run.summary(), "cpu_ms_per_item": meter.ms_per_item(run.items), **packing}


async def direct_at(ctx: Context, model: str, rate: float) -> Run:
    s = ctx.sizes
    n = int(rate * s.latency_seconds) + 1
    async with SingleCalls(ctx.harness.triton.grpc_url, TRITON_NAME[model], n) as calls:
        return await load.open_loop(calls.call(), rate, s.latency_seconds, timeout_s=s.timeout_s)


async def p3_model(ctx: Context, model: str) -> dict[str, Any]:
    cap = await capacity(ctx, model)
    levels: list[dict[str, Any]] = []
    for level in ctx.sizes.latency_levels:
        rate = max(1.0, cap * level)
        over = await overspill_at(ctx, model, rate)
        dire = (await direct_at(ctx, model, rate)).summary()
        levels.append(
            {
                "level": level,
                "offered_per_s": round(rate, 1),
                "overspill": over,
                "direct": dire,
                "p99_ratio": ratio(over.get("p99_ms", 0.0), dire.get("p99_ms", 0.0)),
            }
        )
    return {"capacity_per_s": cap, "levels": levels}


def at_level(levels: list[dict[str, Any]], level: float) -> dict[str, Any]:
    return min(levels, key=lambda row: abs(row["level"] - level))


async def p3(ctx: Context) -> None:
    out = {FIXED: await p3_model(ctx, FIXED), EMBED: await p3_model(ctx, EMBED)}
    ctx.details["p3"] = out
    half = at_level(out[FIXED]["levels"], 0.5)
    ctx.headline["p3_p99_ratio"] = half["p99_ratio"]
    ctx.headline["p3_p99_ratio_embedding"] = at_level(out[EMBED]["levels"], 0.5)["p99_ratio"]
