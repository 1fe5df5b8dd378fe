"""Nothing is lost: killed workers, a stopped Triton, cancellations and deadlines all end in
exactly one terminal state."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from arq.worker import RetryJob
from redis.exceptions import ConnectionError as RedisConnectionError

from producer import Client
from producer.contract import chunk_of
from workers.jobs import task as task_module
from workers.jobs.task import run_items

from .conftest import Triton, WorkerFactory, start_triton

FIXED = "fixed-cost"
RERANK = "minilm-l6-cosine-rerank"


async def done_markers(client: Client, ids: list[str]) -> list[int]:
    """How many times each job was finished (the done list gets one element per terminal write)."""
    return [await client.redis.llen(client.keys.done(i)) for i in ids]


async def until_running(client: Client, ids: list[str], timeout: float = 30.0) -> None:
    """Return once a worker has started some of ``ids`` (their records say ``running``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = [await client.redis.hget(client.keys.job(i), "status") for i in ids]
        if "running" in statuses:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no job started within {timeout}s")


async def test_jobs_survive_a_sigkilled_worker(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    triton.set_exec_ms(400)  # slow batches, so some are in flight when the worker dies
    try:
        first = start_worker(job_timeout_s=2)
        await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s
        ids = await client.submit_many([("embed", {"model": FIXED, "input": f"t{i}"}) for i in range(200)])
        singles = await asyncio.gather(
            *(client.submit("embed", {"model": FIXED, "input": f"s{i}"}) for i in range(100))
        )
        ids += singles
        await until_running(client, ids)
        await asyncio.sleep(0.2)  # a few packages in flight, most items still queued or running
        first.kill()
        triton.set_exec_ms(5)
        started = time.monotonic()
        start_worker(job_timeout_s=2)
        results = await client.wait_many(ids, timeout=90)
    finally:
        triton.set_exec_ms(5)
    assert [r.status for r in results] == ["succeeded"] * len(ids)
    assert max(r.attempts for r in results) >= 2, "some jobs were in flight when the worker died"
    assert await done_markers(client, ids) == [1] * len(ids)
    assert time.monotonic() - started < 60


async def test_bulk_rerank_blocks_survive_a_sigkilled_worker(
    client: Client, start_worker: WorkerFactory
) -> None:
    """A worker killed while it runs rerank chunks as blocks: every job ends succeeded once, the
    jobs it had written stay written, and the rest run again (on the item path)."""
    first = start_worker(job_timeout_s=2)
    docs = [f"document {j}: " + "words about rivers and towns " * 12 for j in range(6)]
    queries = ["where do rivers run?", "which towns are old?", "what is a document?"]
    bodies = [{"model": RERANK, "query": queries[i % 3], "documents": docs} for i in range(160)]
    ids = await client.submit_many([("rerank", b) for b in bodies], lane="bulk")
    deadline = time.monotonic() + 30
    while (await client.get(ids[0])).status.value == "queued":
        assert time.monotonic() < deadline, "the chunk never started"
        await asyncio.sleep(0.02)
    first.kill()
    start_worker(job_timeout_s=2)
    results = await client.wait_many(ids, timeout=120)
    assert [r.status.value for r in results] == ["succeeded"] * len(ids)
    assert max(r.attempts for r in results) >= 2, "some jobs were running when the worker died"
    for chunk_id in {chunk_of(i)[0] for i in ids}:  # type: ignore[index]
        n, d = await client.redis.hmget(client.keys.chunk(chunk_id), ["n", "d"])
        assert d == n, "a job was written twice (or never)"
    for q in range(3):  # the same query scores the same whichever path ran it
        scores = [
            sorted((x["index"], x["relevance_score"]) for x in r.body["results"]) for r in results[q::3]
        ]
        assert all(abs(a[1] - b[1]) < 1e-4 for row in scores for a, b in zip(row, scores[0], strict=True))


async def test_a_package_over_its_time_limit_is_run_again_not_lost(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    triton.set_exec_ms(1500)
    try:
        start_worker(job_timeout_s=1)
        ids = await asyncio.gather(
            *(client.submit("embed", {"model": FIXED, "input": f"slow {i}"}) for i in range(8))
        )
        await asyncio.sleep(2.5)
        triton.set_exec_ms(5)
        results = await client.wait_many(ids, timeout=60)
    finally:
        triton.set_exec_ms(5)
    assert [r.status for r in results] == ["succeeded"] * 8
    assert max(r.attempts for r in results) >= 2
    assert await done_markers(client, ids) == [1] * 8


async def test_a_job_that_always_times_out_fails_after_max_tries(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    triton.set_exec_ms(1500)
    try:
        start_worker(job_timeout_s=0.5, max_tries=2)
        await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s of the last read
        job = await client.submit("embed", {"model": FIXED, "input": "hopeless"})
        result = await client.wait(job, timeout=60)
    finally:
        triton.set_exec_ms(5)
    assert result.status == "failed" and result.error.type == "worker_crashed"
    assert "2 times" in result.error.message


async def test_a_stopped_triton_makes_jobs_wait_not_fail(
    client: Client, start_worker: WorkerFactory, run_dir: Path
) -> None:
    own = start_triton(run_dir, models=["fixed_cost"])
    ports = (
        int(own.http_url.rsplit(":", 1)[1]),
        int(own.grpc_url.rsplit(":", 1)[1]),
        int(own.metrics_url.split(":")[2].split("/")[0]),
    )
    try:
        start_worker(triton_server=own)
        warm = await client.submit("embed", {"model": FIXED, "input": "before"})
        assert (await client.wait(warm, timeout=30)).status == "succeeded"

        own.process.stop()
        ids = [await client.submit("embed", {"model": FIXED, "input": f"during {i}"}) for i in range(20)]
        doomed = await client.submit("embed", {"model": FIXED, "input": "short deadline"}, deadline=2)
        await asyncio.sleep(4)
        assert {(await client.get(i)).status for i in ids} <= {"queued", "running"}

        own = start_triton(run_dir, ports=ports, models=["fixed_cost"])
        results = await client.wait_many(ids, timeout=60)
        assert [r.status for r in results] == ["succeeded"] * 20
        expired = await client.wait(doomed, timeout=30)
        assert expired.status == "expired"
        assert expired.error is not None and expired.error.type == "deadline_exceeded"
        assert "backend" in expired.error.message
    finally:
        own.process.stop()


async def test_a_cancelled_job_never_runs(client: Client, start_worker: WorkerFactory) -> None:
    keep = await client.submit("embed", {"model": FIXED, "input": "keep"})
    drop = await client.submit("embed", {"model": FIXED, "input": "drop"})
    cancelled = await client.cancel(drop)
    assert cancelled.status == "cancelled"
    start_worker()
    assert (await client.wait(keep, timeout=30)).status == "succeeded"
    after = await client.wait(drop, timeout=5)
    assert after.status == "cancelled" and after.attempts == 0 and after.body is None
    assert (await client.cancel(drop)).status == "cancelled"  # cancelling twice is harmless
    assert await done_markers(client, [keep, drop]) == [1, 1]


async def test_a_job_past_its_deadline_expires_instead_of_running(
    client: Client, start_worker: WorkerFactory
) -> None:
    job = await client.submit("embed", {"model": FIXED, "input": "late"}, deadline=0.5)
    await asyncio.sleep(1.0)
    start_worker()
    result = await client.wait(job, timeout=30)
    assert result.status == "expired" and result.error.type == "deadline_exceeded"


async def test_unknown_and_foreign_jobs_are_not_found(client: Client) -> None:
    from producer import JobNotFound

    with pytest.raises(JobNotFound):
        await client.get("job_does_not_exist")
    job = await client.submit("embed", {"model": FIXED, "input": "mine"}, tenant="acme")
    assert (await client.get(job, tenant="acme")).status == "queued"
    with pytest.raises(JobNotFound):
        await client.get(job, tenant="other")
    with pytest.raises(JobNotFound):
        await client.cancel(job, tenant="other")


async def test_a_malformed_item_fails_even_when_its_package_is_a_re_run(
    client: Client, start_worker: WorkerFactory
) -> None:
    """A re-run package is split and re-queued; its unparseable items must not vanish with it."""
    from arq.constants import job_key_prefix
    from arq.jobs import serialize_job

    from producer.contract import TASK_NAME, pack_job

    good, other, bad = "job_handmade_good", "job_handmade_other", "job_handmade_bad"
    for job_id in (good, other, bad):  # the records a producer writes, without a package of their own
        await client.redis.hset(
            client.keys.job(job_id),
            mapping={
                "status": "queued",
                "kind": "embed",
                "tenant": "default",
                "created_at": time.time(),
                "attempts": 0,
            },
        )
    now = time.time()
    items = [
        {"id": good, "kind": "embed", "body": {"model": FIXED, "input": "fine"}, "created_at": now,
         "deadline_at": now + 60},
        {"id": other, "kind": "embed", "body": {"model": FIXED, "input": "also fine"}, "created_at": now,
         "deadline_at": now + 60},
        {"id": bad, "kind": "embed", "body": {"model": FIXED, "input": "x"}},  # no timestamps
    ]  # fmt: skip
    data = serialize_job(TASK_NAME, ({"items": items},), {}, 2, int(now * 1000), serializer=pack_job)
    await client.redis.psetex(job_key_prefix + "pkg_handmade", 60_000, data)
    await client.redis.zadd(client.keys.queue("interactive"), {"pkg_handmade": int(now * 1000)})
    start_worker()
    broken = await client.wait(bad, timeout=30)
    assert broken.status == "failed" and broken.error.type == "invalid_request"
    assert [r.status for r in await client.wait_many([good, other], timeout=30)] == ["succeeded"] * 2


class _RedisLostMidPackage:
    """A package run whose Redis went away: ``release`` answers after ``outage`` failed tries."""

    def __init__(self, outage: int) -> None:
        self.outage, self.released = outage, 0
        self.draining = False

    async def run_package(self, payload: object, *, package_id: str, job_try: int) -> dict[str, int]:
        raise RedisConnectionError("Connection closed by server.")

    async def release(self, payload: object, job_try: int, why: str = "drain") -> dict[str, int]:
        if self.outage > 0:
            self.outage -= 1
            raise RedisConnectionError("Error 111 connecting")
        self.released += 1
        return {"drained": 1}


async def test_a_package_whose_redis_went_away_goes_back_in_line_not_to_arqs_failed_jobs() -> None:
    """Raised, a Redis error would make arq finish the package as failed (off its queue) as soon
    as Redis answers again, and its jobs would stay ``running`` for ever: it is re-queued instead."""
    state = _RedisLostMidPackage(outage=3)
    assert await run_items({"state": state, "job_id": "pkg_1", "job_try": 1}, {}) == {"drained": 1}
    assert state.released == 1


async def test_a_package_whose_redis_stays_away_is_left_to_arq_to_run_again(monkeypatch) -> None:
    monkeypatch.setattr(task_module, "OUTAGE_REQUEUE_TRIES", 2)
    state = _RedisLostMidPackage(outage=10)
    with pytest.raises(RetryJob):  # arq keeps its queue entry: "cancelled, will be run again"
        await run_items({"state": state, "job_id": "pkg_1", "job_try": 1}, {})
