"""``bench chaos`` slowdown scenarios: the backend 5× slower for a while, or the CPU shared with
a hog, mid-run. Goodput is items/s while degraded ÷ the same Triton's direct batched rate
under the same fault: what the system delivers of what the degraded backend can still do."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from producer import Client

from . import direct
from .chaos_parts import Parts, outcome, steady_rate, submit

SLOW_FACTOR = 5.0
FAULT_S = 15.0  # how long each fault lasts, 3 s into the run
TIME_LIMIT_S = 5.0  # OVERSPILL_JOB_TIMEOUT_S of these runs: shorter than a slowed request's wait
HOGS = 6  # busy-looping processes on 2 cores: a load of about 8, as a shared machine shows
HOG_LIMIT_S = 120  # each hog ends by itself after this, whatever happens to the bench


@contextmanager
def cpu_hog(n: int = HOGS) -> Iterator[None]:
    """``n`` processes spinning on the CPU at normal priority while the block runs."""
    loop = f"import time\nend = time.monotonic() + {HOG_LIMIT_S}\nwhile time.monotonic() < end: pass"
    spin = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]
    try:
        yield
    finally:
        for p in spin:
            p.kill()
            p.wait()


async def degraded(
    parts: Parts, jobs: int, name: str, fault: Callable[[], Any], direct_ms: float
) -> dict[str, Any]:
    """Run ``jobs`` jobs on one worker; 3 s in, ``fault()`` (a context manager) holds for
    ``FAULT_S``. The direct rate is measured under the same fault, before the run."""
    parts.triton.set_exec_ms(direct_ms)
    await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s
    with fault():
        await asyncio.sleep(0.7)
        direct_run = await direct.batched(parts.triton.grpc_url, "fixed_cost", 64 * 12, 4, timeout_s=120)
    await asyncio.sleep(0.7)
    log_name = f"worker-{name}"
    worker = parts.worker(f"chaos-{name}", log_name, OVERSPILL_JOB_TIMEOUT_S=str(TIME_LIMIT_S))
    try:
        async with Client(parts.redis_url, prefix=f"chaos-{name}") as client:
            started = time.monotonic()
            ids = await submit(client, jobs, name)
            waiter = asyncio.create_task(client.wait_many(ids, timeout=600))
            await asyncio.sleep(3.0)
            with fault():
                fault_from = time.time() + 0.5  # a cost file is re-read within 0.5 s
                await asyncio.sleep(FAULT_S)
            fault_to = time.time()
            results = await waiter
            seconds = time.monotonic() - started
            counts = await outcome(client, ids, results)
    finally:
        worker.stop()
    rate = steady_rate(
        [r.finished_at for r in results if r.finished_at and fault_from <= r.finished_at <= fault_to]
    )
    timeouts = parts.events(log_name, "package timed out, re-queued")
    return {
        **counts,
        "seconds": round(seconds, 1),
        "time_limit_s": TIME_LIMIT_S,
        "degraded_items_s": round(rate, 1),
        "direct_degraded_items_s": round(direct_run.rate, 1),
        "goodput": round(rate / direct_run.rate, 2),
        "timeouts": len(timeouts),
        "empty_timeouts": sum(1 for e in timeouts if e.get("kept") == 0),
    }


async def slowdown(parts: Parts, jobs: int, exec_ms: float) -> dict[str, Any]:
    """The model's cost raised 5× (``exec_ms`` → 5 × ``exec_ms``) for ``FAULT_S``, then back."""
    slow_ms = exec_ms * SLOW_FACTOR

    @contextmanager
    def slower() -> Iterator[None]:
        parts.triton.set_exec_ms(slow_ms)
        try:
            yield
        finally:
            parts.triton.set_exec_ms(exec_ms)

    return {**await degraded(parts, jobs, "slow", slower, exec_ms), "slow_exec_ms": slow_ms}


async def hogged(parts: Parts, jobs: int, exec_ms: float) -> dict[str, Any]:
    """``HOGS`` CPU-bound processes competing with Triton, the worker and Redis for ``FAULT_S``."""
    return {**await degraded(parts, jobs, "hog", cpu_hog, exec_ms), "hogs": HOGS}
