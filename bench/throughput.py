"""P1 (bulk) and P2 (interactive): overspill's items/s against the direct limits."""

from __future__ import annotations

import asyncio
from typing import Any

from . import direct, load
from .context import Context
from .harness import EMBED, FIXED, TRITON_NAME
from .stats import ratio, ratio_range, reps_summary

WARMUP_ITEMS = 256


async def direct_limit(ctx: Context, model: str, n: int) -> dict[str, Any]:
    """The best direct batched rate (64 per request, concurrency 1/2/4); cached per model."""
    cache = ctx.details.setdefault("direct_batched", {})
    if model in cache:
        return dict(cache[model])
    s, url = ctx.sizes, ctx.harness.triton.grpc_url
    best, probes = await direct.best_batched(
        url, TRITON_NAME[model], s.direct_probe_items, timeout_s=s.timeout_s
    )
    with ctx.cpu() as meter:
        runs = [
            await direct.batched(url, TRITON_NAME[model], n, best, timeout_s=s.timeout_s)
            for _ in range(s.reps)
        ]
    cpu = {k: v for k, v in meter.ms_per_item(n * s.reps).items() if k in ("load_generator", "triton")}
    cache[model] = {"concurrency": best, "probes": probes, **reps_summary(runs), "cpu_ms_per_item": cpu}
    return dict(cache[model])


async def p1_model(ctx: Context, model: str, n: int) -> dict[str, Any]:
    s = ctx.sizes
    ctx.main_worker()
    async with ctx.client() as client:
        await load.bulk(client, model, WARMUP_ITEMS, timeout_s=s.timeout_s)
        with ctx.cpu() as meter, ctx.packing() as packing:
            runs = [await load.bulk(client, model, n, timeout_s=s.timeout_s) for _ in range(s.reps)]
    ctx.harness.flush()
    limit = await direct_limit(ctx, model, n)
    overspill = reps_summary(runs)
    overspill["cpu_ms_per_item"] = meter.ms_per_item(sum(r.items for r in runs))
    overspill.update(packing)
    return {
        "overspill": overspill,
        "direct": limit,
        "ratio": ratio(overspill["items_per_s"], limit["items_per_s"]),
        "ratio_range": ratio_range(overspill, limit),
    }


async def p1(ctx: Context) -> None:
    s = ctx.sizes
    out = {
        FIXED: await p1_model(ctx, FIXED, s.bulk_items_fixed),
        EMBED: await p1_model(ctx, EMBED, s.bulk_items_embed),
    }
    ctx.details["p1"] = out
    ctx.headline["p1_bulk_vs_direct"] = out[FIXED]["ratio"]
    ctx.headline["p1_bulk_vs_direct_range"] = out[FIXED]["ratio_range"]
    ctx.headline["p1_bulk_vs_direct_embedding"] = out[EMBED]["ratio"]
    cpu_headline(ctx, "bulk", out[FIXED]["overspill"], out[FIXED]["direct"])


def cpu_total(run: dict[str, Any]) -> float:
    """CPU ms per item summed over every process the run metered."""
    return round(sum(run["cpu_ms_per_item"].values()), 4)


def cpu_headline(ctx: Context, path: str, overspill: dict[str, Any], direct_run: dict[str, Any]) -> None:
    """``cpu_ms_per_item_<path>`` (all our processes) and its ratio to the direct client's."""
    ours, theirs = cpu_total(overspill), cpu_total(direct_run)
    ctx.headline[f"cpu_ms_per_item_{path}"] = ours
    ctx.headline["cpu_ms_per_item_direct"] = theirs
    ctx.headline[f"cpu_{path}_vs_direct"] = ratio(ours, theirs)


async def interactive(ctx: Context, model: str, n: int, **client_kwargs: Any) -> dict[str, Any]:
    """``reps`` closed-loop runs of single-item jobs through the async client, summarised."""
    s = ctx.sizes
    ctx.main_worker()
    async with ctx.client(**client_kwargs) as client:
        await load.closed_loop(client, model, min(n, WARMUP_ITEMS), s.users, timeout_s=s.timeout_s)
        with ctx.cpu() as meter, ctx.packing() as packing:
            runs = [
                await load.closed_loop(client, model, n, s.users, timeout_s=s.timeout_s)
                for _ in range(s.reps)
            ]
    ctx.harness.flush()
    out = reps_summary(runs)
    out["cpu_ms_per_item"] = meter.ms_per_item(sum(r.items for r in runs))
    out.update(packing)
    return out


async def p2_model(ctx: Context, model: str, n: int) -> dict[str, Any]:
    s = ctx.sizes
    overspill = await interactive(ctx, model, n)
    url = ctx.harness.triton.grpc_url
    naive_runs = [
        await asyncio.to_thread(direct.naive, url, TRITON_NAME[model], s.naive_seconds) for _ in range(s.reps)
    ]
    naive = reps_summary(naive_runs)
    limit = await direct_limit(ctx, model, max(n, s.direct_probe_items))
    return {
        "overspill": overspill,
        "naive": naive,
        "direct": limit,
        "vs_naive": ratio(overspill["items_per_s"], naive["items_per_s"]),
        "vs_direct": ratio(overspill["items_per_s"], limit["items_per_s"]),
        "vs_direct_range": ratio_range(overspill, limit),
        "users": s.users,
    }


async def p2(ctx: Context) -> None:
    s = ctx.sizes
    out = {
        FIXED: await p2_model(ctx, FIXED, s.interactive_items),
        EMBED: await p2_model(ctx, EMBED, s.interactive_items_embed),
    }
    ctx.details["p2"] = out
    ctx.headline["p2_vs_naive"] = out[FIXED]["vs_naive"]
    ctx.headline["p2_vs_direct"] = out[FIXED]["vs_direct"]
    ctx.headline["p2_vs_direct_range"] = out[FIXED]["vs_direct_range"]
    ctx.headline["p2_vs_naive_embedding"] = out[EMBED]["vs_naive"]
    ctx.headline["p2_vs_direct_embedding"] = out[EMBED]["vs_direct"]
    cpu_headline(ctx, "interactive", out[FIXED]["overspill"], out[FIXED]["direct"])


async def capacity(ctx: Context, model: str) -> float:
    """P2's measured overspill capacity (items/s) for ``model``, measuring it if P2 did not run."""
    p2_out = ctx.details.get("p2", {}).get(model)
    if p2_out:
        return float(p2_out["overspill"]["items_per_s"])
    n = ctx.sizes.interactive_items if model == FIXED else ctx.sizes.interactive_items_embed
    cache = ctx.details.setdefault("capacity", {})
    if model not in cache:
        cache[model] = (await interactive(ctx, model, n))["items_per_s"]
    return float(cache[model])
