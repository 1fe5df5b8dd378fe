"""P6: single-item requests through the async client and the HTTP API vs arq's no-op job rate.

Figures from one run: overspill's interactive items/s at saturation through the async
client (coalesced submissions) and through the HTTP API, the client's rate with one arq job
per request, and a bare arq worker running a no-op function with the same ``max_jobs`` and
``poll_delay``. Plus p99 at 50 % load through the client.
"""

from __future__ import annotations

from typing import Any

from .api import through_api
from .context import Context, supports_uncoalesced
from .harness import FIXED, wait_for_log
from .latency import overspill_at
from .noop import noop_rate
from .stats import median, ratio
from .throughput import capacity, interactive

NOOP_QUEUE = "bench:noop"
COALESCE_WINDOW_MS = 5.0  # the client's default (the most a request waits; none when alone)
BATCH_WINDOW_MS = 2.0  # the worker's default max_wait_ms for the fixed-cost model
MODEL_MS = 5.0
P99_GOAL_MS = 2 * (COALESCE_WINDOW_MS + BATCH_WINDOW_MS + MODEL_MS)


async def arq_noop(ctx: Context) -> dict[str, Any]:
    h, s = ctx.harness, ctx.sizes
    h.stop_workers()
    proc = h.start_process("noop-worker", "bench.noop", {}, [h.redis_url, NOOP_QUEUE])
    wait_for_log(proc, "noop worker started", timeout_s=30)
    try:
        await noop_rate(h.redis_url, NOOP_QUEUE, min(200, s.noop_jobs), timeout_s=s.timeout_s)
        rates = [
            await noop_rate(h.redis_url, NOOP_QUEUE, s.noop_jobs, timeout_s=s.timeout_s)
            for _ in range(s.reps)
        ]
    finally:
        h.stop_workers()
    return {"jobs_per_s": round(median(rates), 1), "rates": [round(r, 1) for r in rates], "jobs": s.noop_jobs}


async def p6(ctx: Context) -> None:
    s = ctx.sizes
    cap = await capacity(ctx, FIXED)
    out: dict[str, Any] = {"coalesced_items_per_s": cap}
    if supports_uncoalesced():
        out["one_job_per_request"] = await interactive(
            ctx, FIXED, s.interactive_items, coalesce_window_ms=None
        )
    out["api"] = await through_api(ctx, FIXED, s.interactive_items, s.users)
    # Like every rate here, the p99 is the median of the repetitions (each one is kept).
    halves = [await overspill_at(ctx, FIXED, cap * 0.5) for _ in range(s.reps)]
    half = sorted(halves, key=lambda h: h.get("p99_ms", 0.0))[len(halves) // 2]
    out["half_load"] = {
        "offered_per_s": round(cap * 0.5, 1),
        **half,
        "p99s_ms": [h.get("p99_ms", 0.0) for h in halves],
    }
    out["noop"] = await arq_noop(ctx)
    out["p99_goal_ms"] = P99_GOAL_MS
    ctx.details["p6"] = out
    ctx.headline["p6_items_vs_arq_noop"] = ratio(cap, out["noop"]["jobs_per_s"])
    ctx.headline["p6_api_items_vs_arq_noop"] = ratio(out["api"]["items_per_s"], out["noop"]["jobs_per_s"])
    ctx.headline["p6_p99_ms_at_half_load"] = out["half_load"].get("p99_ms", 0.0)
    if "one_job_per_request" in out:
        ctx.headline["p6_items_vs_one_job_per_request"] = ratio(
            cap, out["one_job_per_request"]["items_per_s"]
        )
