"""arq's own ceiling: a worker whose only function does nothing, and its measured job rate.

Run as ``python -m bench.noop REDIS_URL QUEUE`` (the worker). :func:`noop_rate` enqueues jobs
deferred to one instant, so they all become due together, and times how long the worker
takes to empty the queue. The worker has the same ``max_jobs`` and ``poll_delay`` as
overspill's interactive lane.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import time
from typing import Any

from arq.connections import RedisSettings, create_pool
from arq.worker import Worker

MAX_JOBS = 256
POLL_DELAY_S = 0.005
NOOP_DB = 1  # its own database, so "done" is "the database is back to its baseline size"


async def noop(ctx: dict[str, Any]) -> None:
    return None


def settings(redis_url: str) -> RedisSettings:
    s = RedisSettings.from_dsn(redis_url)
    s.database = NOOP_DB
    return s


def run_worker(redis_url: str, queue: str) -> None:
    worker = Worker(
        functions=[noop],
        queue_name=queue,
        redis_settings=settings(redis_url),
        max_jobs=MAX_JOBS,
        poll_delay=POLL_DELAY_S,
        keep_result=0,
        log_results=False,
        health_check_interval=3600,
    )
    print("noop worker started", flush=True)
    worker.run()


async def noop_rate(redis_url: str, queue: str, n: int, *, timeout_s: float) -> float:
    """No-op jobs per second the running worker on ``queue`` completes."""
    pool = await create_pool(settings(redis_url))
    try:
        baseline = await pool.dbsize()
        due = time.time() + 0.5 + n / 2500
        when = dt.datetime.fromtimestamp(due, tz=dt.UTC)
        sem = asyncio.Semaphore(50)

        async def enqueue() -> None:
            async with sem:
                await pool.enqueue_job("noop", _queue_name=queue, _defer_until=when)

        await asyncio.gather(*(enqueue() for _ in range(n)))
        start = max(due, time.time())
        deadline = start + timeout_s
        while await pool.dbsize() > baseline and time.time() < deadline:
            await asyncio.sleep(0.01)
        return n / (time.time() - start)
    finally:
        await pool.aclose()


if __name__ == "__main__":
    run_worker(sys.argv[1], sys.argv[2])
