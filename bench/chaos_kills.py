"""``bench chaos`` kill scenarios: workers SIGKILLed mid-run, how fast their work resumes, and
how fast a new worker gets going."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import time
from typing import Any

from arq.constants import in_progress_key_prefix

from producer import Client

from .chaos_parts import Parts, outcome, submit

RERUN_EVENT = "package re-run split to isolate a crash"  # a dead worker's package run again


async def kills(parts: Parts, jobs: int, kills: int, prefix: str, n_workers: int = 2) -> dict[str, Any]:
    """``jobs`` jobs on ``n_workers`` workers; every 2 s while work is left (``kills`` times at
    most) one of them is SIGKILLed, in turn, and a new one started, as an orchestrator would."""
    workers = [parts.worker(prefix, f"worker-{prefix}-{i}") for i in range(n_workers)]
    started_workers = n_workers
    try:
        async with Client(parts.redis_url, prefix=prefix) as client:
            started = time.monotonic()
            ids = await submit(client, jobs, prefix)
            waiter = asyncio.create_task(client.wait_many(ids, timeout=600))
            done_kills = 0
            killed: list[tuple[float, set[str]]] = []  # when, and the packages in progress then
            while done_kills < kills:
                await asyncio.wait({waiter}, timeout=2.0)
                if waiter.done():
                    break
                keys = await client.redis.keys(in_progress_key_prefix + "*")
                held = {
                    (k.decode() if isinstance(k, bytes) else k).removeprefix(in_progress_key_prefix)
                    for k in keys
                }
                killed.append((time.time(), held))
                victim = done_kills % n_workers
                workers[victim].kill()
                workers[victim] = parts.worker(prefix, f"worker-{prefix}-{started_workers}")
                started_workers += 1
                done_kills += 1
            results = await waiter
            took = time.monotonic() - started
            names = [f"worker-{prefix}-{i}" for i in range(started_workers)]
            reclaim = reclaim_s(killed, [e for n in names for e in parts.events(n, RERUN_EVENT)])
            return {
                **await outcome(client, ids, results),
                "workers": n_workers,
                "seconds": round(took, 1),
                "kills": done_kills,
                "kill_to_reclaim_s": reclaim,
            }
    finally:
        for w in workers:
            w.stop()


def reclaim_s(killed: list[tuple[float, set[str]]], reruns: list[dict[str, Any]]) -> list[float]:
    """Per kill, seconds to the first re-run of a package claimed since the kill before and in
    progress at this one: the dead worker's come back as re-runs, the other worker's finish
    (or come back only after its own kill, later). A kill with none is skipped."""
    runs = [(dt.datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp(), e.get("package_id"))
            for e in reruns]  # fmt: skip
    out = []
    seen: set[str] = set()  # in progress at an earlier kill: an earlier victim's, or older work
    for at, held in killed:
        new = held - seen
        seen |= held
        after = [t for t, package in runs if t >= at and package in new]
        if after:
            out.append(round(min(after) - at, 2))
    return out


async def startup(parts: Parts, runs: int = 3) -> dict[str, Any]:
    """A worker started with work queued: seconds from its launch to that work's first result."""
    firsts = []
    for n in range(runs):
        prefix = f"chaos-start-{n}"
        async with Client(parts.redis_url, prefix=prefix) as client:
            ids = await submit(client, 32, prefix)
            launched = time.time()
            worker = parts.worker(prefix, f"worker-start-{n}")
            try:
                results = await client.wait_many(ids, timeout=60)
            finally:
                worker.stop()
        firsts.append(min(r.finished_at or launched for r in results) - launched)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import workers.app.main"], check=True)
    return {
        "first_result_s": [round(s, 2) for s in firsts],
        "imports_s": round(time.perf_counter() - started, 2),
    }
