"""Faults under load: the system keeps its promises while its parts fail.

Each test runs real processes (a private ``redis-server`` with AOF, real workers, the session's
Triton), is bounded in time, and counts every job it submitted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer import Client
from stack.processes import ManagedProcess, free_port, python_process, redis_process
from tests.conftest import Triton, worker_env

FIXED = "fixed-cost"


@pytest.fixture
def private_redis(run_dir: Path) -> Iterator[tuple[ManagedProcess, int]]:
    """A redis-server of this test only (AOF, fsync every second): it may be killed."""
    port = free_port()
    server = redis_process(port, run_dir).start()
    yield server, port
    server.stop()


async def submit_for(client: Client, seconds: float, tag: str) -> tuple[list[str], int]:
    """Submit batches of jobs for ``seconds``; the ids accepted, and how many submits failed."""
    accepted: list[str] = []
    refused = 0
    until = time.monotonic() + seconds
    n = 0
    while time.monotonic() < until and n < 400:
        n += 1
        try:
            accepted += await client.submit_many(
                [("embed", {"model": FIXED, "input": f"{tag}{n}-{i}"}) for i in range(25)]
            )
        except Exception:  # Redis is down: nothing was accepted, the producer retries later
            refused += 1
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.02)
    return accepted, refused


async def test_a_redis_restart_mid_run_loses_nothing_and_keeps_the_worker(
    private_redis: tuple[ManagedProcess, int], triton: Triton, run_dir: Path
) -> None:
    server, port = private_redis
    url = f"redis://127.0.0.1:{port}/0"
    env = worker_env(url, triton, "chaos", job_timeout_s=5)
    worker = python_process("worker", "workers", run_dir, env, log_name="worker-chaos-redis").start()
    try:
        async with Client(url, prefix="chaos") as client:
            before = await client.submit_many(
                [("embed", {"model": FIXED, "input": f"before {i}"}) for i in range(2000)]
            )
            await asyncio.sleep(0.5)  # the worker is mid-run: some done, some in flight, most queued
            await asyncio.sleep(1.2)  # AOF fsyncs every second: what was accepted is on disk
            server.kill()
            during, refused = await submit_for(client, 2.0, "during")
            server.start()  # same port, same directory: the AOF brings every record back
            restarted = time.monotonic()
            after = await client.submit_many(
                [("embed", {"model": FIXED, "input": f"after {i}"}) for i in range(200)]
            )
            ids = before + during + after
            results = await client.wait_many(ids, timeout=60)
            took = time.monotonic() - restarted
        assert worker.alive(), "the worker exited when Redis went away"
        statuses = [r.status.value for r in results]
        assert statuses.count("succeeded") == len(ids), {s: statuses.count(s) for s in set(statuses)}
        assert took < 60
        assert refused > 0, "Redis was down while the producer submitted"
        log = worker.log_path.read_text(errors="replace")
        assert "redis reachable again" in log
    finally:
        worker.stop()
