"""Bulk chunks: a bulk ``submit_many`` is one record and one package per chunk of jobs, and every
job still has its own id, status, attempts, result and error; cancel, tenancy, bad items,
killed workers and crash splitting work job by job as they do for jobs with records of their own."""

from __future__ import annotations

import asyncio
import time

import pytest

from producer import Client, JobNotFound
from producer.contract import chunk_of

from .conftest import Triton, WorkerFactory

FIXED = "fixed-cost"


def embeds(n: int, tag: str = "t") -> list[tuple[str, dict[str, str]]]:
    return [("embed", {"model": FIXED, "input": f"{tag}{i}"}) for i in range(n)]


async def keys_of(client: Client, kind: str) -> list[str]:
    return [k async for k in client.redis.scan_iter(f"{client.keys.root}:{kind}:*")]


async def test_a_bulk_submission_is_one_record_per_chunk_and_one_result_per_job(
    client: Client, start_worker: WorkerFactory
) -> None:
    client.chunk_size = 100
    requests = embeds(250)
    requests[7] = ("embed", {"model": FIXED, "input": "tagged"}, {"line": "7"})
    ids = await client.submit_many(requests, lane="bulk", tenant="acme", metadata={"run": "n1"})
    assert len(set(ids)) == 250 and all(chunk_of(i) for i in ids)
    assert len({chunk_of(i)[0] for i in ids}) == 3  # 100 + 100 + 50
    assert len(await keys_of(client, "chunk")) == 3 and await keys_of(client, "job") == []
    queued = await client.get(ids[7], tenant="acme")
    assert queued.status == "queued" and queued.attempts == 0
    assert queued.metadata == {"run": "n1", "line": "7"}

    start_worker()
    results = {r.id: r async for r in client.iter_results(ids, timeout=60, tenant="acme")}
    assert set(results) == set(ids)
    assert {r.status for r in results.values()} == {"succeeded"}
    assert all(r.attempts == 1 and r.tenant == "acme" and r.body["data"] for r in results.values())
    assert results[ids[7]].metadata == {"run": "n1", "line": "7"}
    assert results[ids[8]].metadata == {"run": "n1"}
    assert (await client.wait(ids[249], timeout=5, tenant="acme")).id == ids[249]
    for key in await keys_of(client, "chunk"):  # results live as long as a result does
        assert 0 < await client.redis.ttl(key) <= client.result_ttl_s + 3600 + 24 * 3600


async def test_a_bad_item_fails_alone_with_its_error(client: Client, start_worker: WorkerFactory) -> None:
    requests = embeds(40)
    requests[13] = ("embed", {"model": FIXED, "input": 12345})  # not text: the worker refuses it
    requests[20] = ("embed", {"model": FIXED})  # no input at all
    ids = await client.submit_many(requests, lane="bulk", validate=False)
    assert len({chunk_of(i)[0] for i in ids}) == 1
    start_worker()
    results = await client.wait_many(ids, timeout=60)
    failed = {r.id: r for r in results if r.status != "succeeded"}
    assert set(failed) == {ids[13], ids[20]}
    assert all(
        r.status == "failed" and r.error.type == "invalid_request" and r.error.message
        for r in failed.values()
    )
    assert sum(r.status == "succeeded" for r in results) == 38


async def test_cancelled_jobs_of_a_chunk_never_run_and_the_rest_do(
    client: Client, start_worker: WorkerFactory
) -> None:
    ids = await client.submit_many(embeds(30), lane="bulk")
    one = await client.cancel(ids[0])
    assert one.status == "cancelled" and one.error.type == "cancelled"
    assert await client.cancel_many(ids[1:5]) == 4
    assert await client.cancel_many(ids[0:5]) == 0  # cancelling twice is harmless
    start_worker()
    results = await client.wait_many(ids, timeout=60)
    assert [r.status for r in results[:5]] == ["cancelled"] * 5
    assert all(r.attempts == 0 and r.body is None for r in results[:5])
    assert [r.status for r in results[5:]] == ["succeeded"] * 25
    assert (await client.cancel(ids[9])).status == "succeeded"  # finished: left as it is


async def test_a_chunk_counts_its_terminal_jobs_once_each_for_its_readers(
    client: Client, start_worker: WorkerFactory
) -> None:
    ids = await client.submit_many(embeds(20), lane="bulk")
    key = client.keys.chunk(chunk_of(ids[0])[0])
    await client.cancel_many(ids[:3])
    await client.cancel_many(ids[:3])  # already terminal: not counted again
    assert await client.redis.hget(key, "d") == "3"
    reader = asyncio.create_task(client.wait_many(ids, timeout=60))  # waiting before any runs
    await asyncio.sleep(0.3)
    start_worker()
    results = await reader
    assert [r.status for r in results] == ["cancelled"] * 3 + ["succeeded"] * 17
    assert await client.redis.hget(key, "d") == "20"


async def test_jobs_of_a_chunk_are_their_tenants_only(client: Client) -> None:
    ids = await client.submit_many(embeds(5), lane="bulk", tenant="acme")
    chunk_id, _ = chunk_of(ids[0])
    for wrong in (f"{chunk_id}.5", f"{chunk_id}.99", "chk_" + "0" * 24 + ".1"):
        with pytest.raises(JobNotFound):
            await client.get(wrong, tenant="acme")
    with pytest.raises(JobNotFound):
        await client.get(ids[0], tenant="other")
    with pytest.raises(JobNotFound):
        await client.cancel(ids[0], tenant="other")
    assert await client.cancel_many(ids, tenant="other") == 0
    with pytest.raises(JobNotFound):
        await client.wait_many(ids, timeout=1, tenant="other")
    assert (await client.get(ids[0], tenant="acme")).status == "queued"


async def test_only_bulk_jobs_without_webhooks_or_streams_are_chunked(client: Client) -> None:
    assert chunk_of((await client.submit_many(embeds(2)))[0]) is None  # interactive
    assert chunk_of((await client.submit_many(embeds(2), lane="bulk", chunked=False))[0]) is None
    hooked = await client.submit_many(
        embeds(2), lane="bulk", webhook={"url": "https://hooks.example.com/done"}
    )
    assert chunk_of(hooked[0]) is None
    from producer import OverspillError

    with pytest.raises(OverspillError):
        await client.submit_many(embeds(2), chunked=True)


async def test_a_chunk_killed_mid_run_finishes_each_job_exactly_once(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    """SIGKILL while a chunk's batches are in Triton: what came back stays written (never
    computed again), the re-run is split and finishes the rest, and no job is lost."""
    triton.set_exec_ms(400)
    try:
        first = start_worker(job_timeout_s=3)
        await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s
        client.chunk_size = 256
        ids = await client.submit_many(embeds(256, "k"), lane="bulk")
        deadline = time.monotonic() + 30
        while not any(r.status == "succeeded" for r in [await client.get(i) for i in ids[::16]]):
            assert time.monotonic() < deadline, "no batch came back"
            await asyncio.sleep(0.05)
        first.kill()
        at_kill = {i: await client.get(i) for i in ids}
        triton.set_exec_ms(5)
        start_worker(job_timeout_s=3)
        results = await client.wait_many(ids, timeout=90)
    finally:
        triton.set_exec_ms(5)
    assert [r.status for r in results] == ["succeeded"] * len(ids)
    kept = [i for i in ids if at_kill[i].status == "succeeded"]
    assert kept and len(kept) < len(ids), "the kill came while some batches were out"
    final = {r.id: r for r in results}
    for job_id in kept:
        assert final[job_id].finished_at == at_kill[job_id].finished_at and final[job_id].attempts == 1
    assert max(r.attempts for r in results) == 2  # the rest ran once more, in the split halves


async def test_a_job_that_crashes_every_run_fails_alone_after_splitting(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    """Every run of the chunk times out while Triton is slow; the re-runs split it until the
    jobs fail with ``worker_crashed`` one by one, never with each other's error."""
    triton.set_exec_ms(1500)
    try:
        start_worker(job_timeout_s=0.5, max_tries=2)
        await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s of the last read
        ids = await client.submit_many(embeds(4, "hopeless"), lane="bulk")
        results = await client.wait_many(ids, timeout=90)
    finally:
        triton.set_exec_ms(5)
    assert [r.status for r in results] == ["failed"] * 4
    assert {r.error.type for r in results} == {"worker_crashed"}
