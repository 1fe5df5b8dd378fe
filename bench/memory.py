"""P5: Redis bytes per queued job, and a worker's RSS before and after processing jobs.

Jobs are queued on a prefix no worker serves, so they stay queued; ``INFO memory``
``used_memory`` is read before and after, and the delta divided by the count. The figure
scales linearly (records and packages are independent keys): 1 M jobs ≈ 10 × a 100 k sample.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from . import load
from .context import Context
from .harness import FIXED, rss_kib

QUEUED_PREFIX = "bench-p5-queued"
RSS_PREFIX = "bench-p5-rss"
CHUNK = 1024


async def redis_bytes_per_job(ctx: Context) -> dict[str, Any]:
    h, n = ctx.harness, ctx.sizes.redis_jobs
    h.stop_workers()
    h.flush()
    gc.collect()
    before = h.used_memory()
    items = load.texts(n)
    start = time.perf_counter()
    async with ctx.client(QUEUED_PREFIX) as client:
        for i in range(0, n, CHUNK):
            await client.submit_many(
                [("embed", load.body(FIXED, t)) for t in items[i : i + CHUNK]], lane="bulk"
            )
    seconds = time.perf_counter() - start
    after = h.used_memory()
    with h.redis() as r:
        keys = int(r.dbsize())
    h.flush()
    per_job = (after - before) / n
    return {
        "jobs": n,
        "used_memory_before": before,
        "used_memory_after": after,
        "bytes_per_job": round(per_job, 1),
        "keys": keys,
        "enqueue_per_s": round(n / seconds, 1),
        "projected_1m_jobs_mb": round(per_job * 1_000_000 / 2**20, 1),
        "input_chars": round(sum(len(t) for t in items) / n, 1),
    }


async def worker_rss(ctx: Context) -> dict[str, Any]:
    h, s = ctx.harness, ctx.sizes
    h.stop_workers()
    proc = h.start_worker(RSS_PREFIX)
    time.sleep(1.0)
    at_start = rss_kib(proc.pid)
    with ctx.cpu() as idle:  # a started worker with nothing to do: what its polling costs
        time.sleep(s.idle_seconds)
    idle_cores = {k: round(v / s.idle_seconds, 3) for k, v in idle.used.items()}
    done = 0
    samples: list[tuple[int, float]] = []  # (jobs done, RSS MiB): a plateau is a bounded worker
    every = max(20_000, s.rss_jobs // 10)
    async with ctx.client(RSS_PREFIX) as client:
        while done < s.rss_jobs:
            n = min(20_000, s.rss_jobs - done)
            run = await load.bulk(client, FIXED, n, timeout_s=s.timeout_s)
            done += run.items + run.failed
            h.flush()
            if done % every < 20_000 or done >= s.rss_jobs:
                samples.append((done, round(rss_kib(proc.pid) / 1024, 1)))
    after = rss_kib(proc.pid)
    h.stop_workers()
    return {
        "jobs": done,
        "rss_samples_mib": samples,
        "rss_start_mib": round(at_start / 1024, 1),
        "rss_after_mib": round(after / 1024, 1),
        "idle_cores": idle_cores,
        "idle_seconds": s.idle_seconds,
    }


async def p5(ctx: Context) -> None:
    out = {"redis": await redis_bytes_per_job(ctx), "worker": await worker_rss(ctx)}
    ctx.details["p5"] = out
    ctx.headline["p5_redis_bytes_per_job"] = out["redis"]["bytes_per_job"]
    ctx.headline["p5_worker_rss_growth_mib"] = round(
        out["worker"]["rss_after_mib"] - out["worker"]["rss_start_mib"], 1
    )
