"""Redis commands and CPU per job: ``python -m bench.redis_cost [JOBS]``.

A private redis-server, the bundled Triton and one worker; JOBS fixed-cost embedding jobs go
through the client three times (concurrent ``submit`` + ``wait`` loops, coalesced; ``submit_many``
on the bulk lane then ``wait_many``; and every job sent with ``submit`` at once, then one
``wait_many`` of them all), each waited for to the end. Redis's own counters (INFO commandstats, used_cpu_user + used_cpu_sys)
are read before and after each pass, so the figures are Redis's work per finished job, every
process's traffic included (client, worker, wake-ups, leases). Prints one JSON line per pass.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from producer import Client

from .harness import Harness

CONCURRENCY = 256


def redis_counters(r: Any) -> tuple[float, dict[str, int]]:
    """Redis's own CPU seconds so far, and its calls per command (scripts' commands included)."""
    cpu = r.info("cpu")
    stats = r.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls


def _counters(h: Harness) -> tuple[float, dict[str, int]]:
    with h.redis() as r:
        return redis_counters(r)


async def _submit_each(client: Client, jobs: int) -> None:
    todo = iter(range(jobs))

    async def loop() -> None:
        for i in todo:
            job = await client.submit("embed", {"model": "fixed-cost", "input": f"item {i}"})
            await client.wait(job, timeout=60)

    await asyncio.gather(*(loop() for _ in range(CONCURRENCY)))


async def _submit_many(client: Client, jobs: int) -> None:
    ids = await client.submit_many(
        [("embed", {"model": "fixed-cost", "input": f"item {i}"}) for i in range(jobs)], lane="bulk"
    )
    await client.wait_many(ids, timeout=120)


async def _submit_then_wait_many(client: Client, jobs: int) -> None:
    ids: list[str] = []
    for start in range(0, jobs, CONCURRENCY):
        batch = range(start, min(jobs, start + CONCURRENCY))
        ids += await asyncio.gather(
            *(client.submit("embed", {"model": "fixed-cost", "input": f"item {i}"}) for i in batch)
        )
    await client.wait_many(ids, timeout=120)


PASSES = {
    "submit": _submit_each,
    "submit_many": _submit_many,
    "submit_then_wait_many": _submit_then_wait_many,
}


def _pass(h: Harness, prefix: str, jobs: int, how: str) -> dict[str, Any]:
    cpu0, calls0 = _counters(h)
    t0 = time.perf_counter()

    async def run() -> None:
        async with Client(h.redis_url, prefix=prefix) as client:
            await PASSES[how](client, jobs)

    client_cpu0 = time.process_time()
    asyncio.run(run())
    wall = time.perf_counter() - t0
    client_cpu = time.process_time() - client_cpu0
    cpu1, calls1 = _counters(h)
    delta = {k: v - calls0.get(k, 0) for k, v in calls1.items() if v > calls0.get(k, 0)}
    commands = sum(delta.values())
    top = sorted(delta.items(), key=lambda kv: -kv[1])[:8]
    return {
        "how": how,
        "jobs": jobs,
        "wall_s": round(wall, 2),
        "jobs_per_s": round(jobs / wall),
        "redis_cpu_s": round(cpu1 - cpu0, 3),
        "redis_cpu_us_per_job": round((cpu1 - cpu0) / jobs * 1e6, 1),
        "redis_cpu_share": round((cpu1 - cpu0) / wall, 3),
        "commands_per_job": round(commands / jobs, 2),
        "client_cpu_us_per_job": round(client_cpu / jobs * 1e6, 1),
        "top_commands_per_job": {k: round(v / jobs, 3) for k, v in top},
    }


def main(jobs: int = 10_000) -> None:
    with Harness.start() as h:
        h.start_worker("rc")
        _pass(h, "rc", 500, "submit")  # warm-up: models, scripts, connections
        for how in PASSES:
            print(json.dumps(_pass(h, "rc", jobs, how)), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
