"""A package's time limit counts from when its work starts and renews while it progresses;
results are written as their batch comes back, so a time-out or a kill keeps finished work."""

from __future__ import annotations

import asyncio

import pytest

from producer import Client
from stack.processes import TritonServer as Triton
from workers.core import Liveness, PackageClock, mark, within

from .conftest import WorkerFactory
from .test_recovery import FIXED, done_markers


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(limit: float = 10.0) -> tuple[PackageClock, Liveness, Clock]:
    t = Clock()
    live = Liveness(t)
    return PackageClock(limit, max_wait_s=30, max_run_s=60, liveness=live, clock=t), live, t


def test_a_started_package_expires_only_after_a_limit_without_progress() -> None:
    clock, _, t = make()
    clock.event()
    t.now += 9
    clock.event()  # a batch came back: the limit starts again
    t.now += 9
    assert not clock.expired()
    t.now += 2
    assert clock.expired()


def test_waiting_to_start_does_not_count_while_the_batchers_progress() -> None:
    clock, live, t = make()
    for _ in range(2):  # 20 s behind other packages' work, batches coming back all along
        t.now += 10
        live.batch_done()
    assert not clock.expired()
    t.now += 11  # then nothing comes back for longer than the limit: something is stuck
    assert clock.expired()


def test_waiting_to_start_is_capped_and_a_run_is_capped() -> None:
    clock, live, t = make()
    t.now += 31
    live.batch_done()
    assert clock.expired(), "waited past max_wait_s"
    clock, live, t = make()
    for _ in range(7):
        t.now += 9
        clock.event()
    assert clock.expired(), "ran past max_run_s, progress or not"


async def test_within_cancels_work_that_stops_progressing_and_spares_work_that_progresses() -> None:
    async def steady() -> str:
        for _ in range(6):  # 0.6 s in all, progress every 0.1 s
            await asyncio.sleep(0.1)
            mark()
        return "done"

    async def stuck() -> str:
        mark()
        await asyncio.sleep(5)
        return "never"

    assert await within(PackageClock(0.25, liveness=Liveness()), steady()) == "done"
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(within(PackageClock(0.25, liveness=Liveness()), stuck()), 3)


async def test_a_package_waiting_behind_a_backlog_is_not_timed_out(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    """Everything claimed at once (no admission): the last packages wait about 2 s for the
    model, twice their 1 s limit, while the batchers keep delivering. None is run twice."""
    triton.set_exec_ms(150)
    try:
        start_worker(job_timeout_s=1, admission=False, bulk_max_jobs=200)
        await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s
        ids = await client.submit_many(
            [("embed", {"model": FIXED, "input": f"w{i}"}) for i in range(768)], lane="bulk"
        )
        results = await client.wait_many(ids, timeout=90)
    finally:
        triton.set_exec_ms(5)
    assert [r.status for r in results] == ["succeeded"] * len(ids)
    assert max(r.attempts for r in results) == 1


async def test_results_that_came_back_before_a_kill_are_kept(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    """One package of six jobs of one batch each (more than the batches in flight at once): the
    jobs whose batch came back are written at once; a SIGKILL while the rest run re-runs only
    the rest, and the written ones are not computed again."""
    triton.set_exec_ms(1500)
    try:
        worker = start_worker(job_timeout_s=20)
        await asyncio.sleep(0.7)
        ids = await client.submit_many(
            [("embed", {"model": FIXED, "input": [f"{name}{i}" for i in range(64)]}) for name in "abcdef"]
        )
        early = await client.wait(ids[0], timeout=30)
        worker.kill()  # later batches are still in Triton or in the batcher
        at_kill = {r.id: r for r in [await client.get(i) for i in ids]}
        triton.set_exec_ms(5)
        start_worker(job_timeout_s=20)
        results = await client.wait_many(ids, timeout=60)
    finally:
        triton.set_exec_ms(5)
    kept = [i for i in ids if at_kill[i].status.value == "succeeded"]
    open_ = [i for i in ids if at_kill[i].status.value in ("queued", "running")]
    assert early.status == "succeeded" and ids[0] in kept
    assert open_, "some batches were still out when the worker died"
    assert len(kept) + len(open_) == len(ids)
    final = {r.id: r for r in results}
    for job_id in kept:  # written before the kill: not computed again
        assert final[job_id].attempts == 1 and final[job_id].finished_at == at_kill[job_id].finished_at
    for job_id in open_:
        assert final[job_id].status == "succeeded" and final[job_id].attempts == 2
    assert await done_markers(client, ids) == [1] * len(ids)


def test_a_started_package_queued_behind_a_slow_backend_is_not_timed_out() -> None:
    """Its items are out, the backend returns other batches slower than before but steadily:
    that is a slowdown, not a stall, and the package keeps its work."""
    clock, live, t = make()
    clock.event()  # its items went out
    for _ in range(4):  # 32 s with no batch of its own back, others back every 8 s
        t.now += 8
        live.batch_done()
        assert not clock.expired()
    t.now += 11  # then the backend returns nothing for longer than the limit
    assert clock.expired()
