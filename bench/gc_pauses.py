"""Garbage collection in a worker under load: ``python -m bench.gc_pauses [JOBS]``.

The bench servers (Redis, Triton with ``fixed_cost``) and one worker per collector setting,
Python's default ``(700, 10, 10)`` and the worker's default (``OVERSPILL_GC_THRESHOLD``), in
turn; each runs JOBS single-text jobs on the bulk lane (the README's ``submit_many`` and
``iter_results``) after a warm-up. The figures are the worker's own: the sum and count of its
``overspill_gc_pause_ms`` per generation over the run, and its CPU per job from /proc. Prints
one JSON line per setting.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import httpx

from producer import Client
from workers.core.settings import WorkerConfig
from workers.routing.signals import parse_metrics

from . import load
from .harness import FIXED, Harness

PYTHON_DEFAULT = (700, 10, 10)
PREFIX = "bench-gc"


def _pauses(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, labels, value in parse_metrics(httpx.get(url, timeout=5).text):
        if name in ("overspill_gc_pause_ms_sum", "overspill_gc_pause_ms_count"):
            out[f"{name.rsplit('_', 1)[1]}_gen{labels.get('generation')}"] = value
    return out


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(h: Harness, threshold: tuple[int, int, int], jobs: int) -> dict[str, Any]:
    worker = h.start_worker(PREFIX, OVERSPILL_GC_THRESHOLD=json.dumps(list(threshold)))
    url = h.metrics_urls[worker.pid]
    try:
        async with Client(h.redis_url, prefix=PREFIX) as client:
            await load.bulk(client, FIXED, 2000, timeout_s=60)  # warm: models, connections, scripts
            before, cpu0, t0 = _pauses(url), _cpu_s(worker.pid), time.perf_counter()
            run = await load.bulk(client, FIXED, jobs, timeout_s=300)
            seconds = time.perf_counter() - t0
            after, cpu1 = _pauses(url), _cpu_s(worker.pid)
    finally:
        h.stop_worker(worker)
    delta = {k: round(after[k] - before.get(k, 0.0), 1) for k in sorted(after)}
    return {
        "gc_threshold": list(threshold),
        "jobs": jobs,
        "failed": run.failed,
        "jobs_per_s": round(jobs / seconds),
        "worker_cpu_ms_per_job": round((cpu1 - cpu0) * 1000 / jobs, 4),
        "gc_ms_total": round(sum(v for k, v in delta.items() if k.startswith("sum")), 1),
        "gc": delta,
    }


def main(jobs: int = 30_000) -> None:
    with Harness.start() as h:
        for threshold in (PYTHON_DEFAULT, WorkerConfig().gc_threshold):
            print(json.dumps(asyncio.run(_measure(h, threshold, jobs))), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30_000)
