"""The worker's queue consumer (arq with one-script claims and wake-ups): producers wake it at
once, deferred work is still found, and no package ever runs twice, whoever competes for it."""

from __future__ import annotations

import asyncio
import time

from producer import Client
from producer.contract import JobKind, Lane, WorkItem, add_package, new_job_id
from stack.processes import ManagedProcess

from .conftest import Triton, WorkerFactory
from .test_recovery import done_markers

FIXED = "fixed-cost"


async def started(proc: ManagedProcess, timeout: float = 60.0) -> None:
    """Return once the worker has logged that it runs (its queues are being consumed)."""
    deadline = time.monotonic() + timeout
    while "worker started" not in proc.log_path.read_text(errors="replace"):
        assert proc.alive() and time.monotonic() < deadline, "the worker did not start"
        await asyncio.sleep(0.05)


async def test_a_queued_package_wakes_the_worker_at_once(client: Client, start_worker: WorkerFactory) -> None:
    """With its timer poll 60 s apart, a worker still picks a new job up within moments."""
    await started(start_worker(poll_delay_s=60))
    await asyncio.sleep(0.5)  # the first timer-driven poll is over; only a wake-up can help now
    begun = time.monotonic()
    job_id = await client.submit("embed", {"model": FIXED, "input": "wake up"})
    result = await client.wait(job_id, timeout=30)
    assert result.status == "succeeded"
    assert time.monotonic() - begun < 10  # far below the 60 s poll: the wake-up did it


async def test_a_deferred_package_is_found_by_the_fallback_poll(
    client: Client, start_worker: WorkerFactory
) -> None:
    """Deferred packages (retries) publish no wake-up: the timer poll must find them when due."""
    now = time.time()
    item = WorkItem(id=new_job_id(), kind=JobKind.embed, body={"model": FIXED, "input": "later"},
                    created_at=now, deadline_at=now + 60)  # fmt: skip
    await client.enqueue([item])  # no worker yet: keep the job's record, replace its package
    await client.redis.delete(client.keys.queue(Lane.interactive))
    async with client.redis.pipeline(transaction=True) as pipe:
        add_package(pipe, client.keys, [item], Lane.interactive, defer_s=2.0)
        await pipe.execute()
    await started(start_worker(poll_delay_s=0.2))
    result = await client.wait(item.id, timeout=30)
    assert result.status == "succeeded"
    assert result.finished_at is not None and result.finished_at >= now + 2.0


async def test_competing_workers_never_run_a_package_twice(
    client: Client, start_worker: WorkerFactory
) -> None:
    for _ in range(2):
        start_worker()
    ids = await client.submit_many([("embed", {"model": FIXED, "input": f"b{i}"}) for i in range(400)])
    ids += await asyncio.gather(
        *(client.submit("embed", {"model": FIXED, "input": f"s{i}"}) for i in range(200))
    )
    results = await client.wait_many(ids, timeout=90)
    assert [r.status for r in results] == ["succeeded"] * len(ids)
    assert {r.attempts for r in results} == {1}  # a second claim would have started a job again
    assert await done_markers(client, ids) == [1] * len(ids)


async def test_a_full_worker_takes_the_next_package_when_a_slot_frees(
    redis_url: str, prefix: str, start_worker: WorkerFactory, triton: Triton
) -> None:
    """One slot, a 60 s timer poll, three packages queued at once: each runs right after the last."""
    triton.set_exec_ms(200)
    try:
        await started(start_worker(poll_delay_s=60, max_jobs=1))
        await asyncio.sleep(0.5)  # past the first timer-driven poll
        async with Client(redis_url, prefix=prefix, pack_size=1) as client:
            ids = await client.submit_many([("embed", {"model": FIXED, "input": f"f{i}"}) for i in range(3)])
            results = await client.wait_many(ids, timeout=20)  # far below the 60 s poll
    finally:
        triton.set_exec_ms(5)
    assert [r.status for r in results] == ["succeeded"] * 3
