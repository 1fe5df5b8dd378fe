"""Two-level batching: concurrent submissions travel as shared work packages, each job keeping
its own identity, status and result."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from producer import Client
from producer.client.coalescer import MAX_TRACKED, Coalescer, split
from producer.contract import JobKind, WorkItem
from producer.errors import JobNotFound

from .conftest import WorkerFactory

FIXED = "fixed-cost"


def item(n: int, model: str = "m") -> WorkItem:
    return WorkItem(id=f"job_{n}", kind=JobKind.embed, body={"model": model, "input": str(n)},
                    created_at=0.0, deadline_at=1.0)  # fmt: skip


class Packages:
    def __init__(self, fail: bool = False) -> None:
        self.written: list[list[str]] = []
        self.fail = fail

    async def __call__(self, items: Sequence[WorkItem]) -> None:
        if self.fail:
            raise ConnectionError("redis down")
        self.written.append([i.id for i in items])


class TestCoalescer:
    async def test_concurrent_submissions_become_one_package(self) -> None:
        packages = Packages()
        coalescer = Coalescer(packages, window_ms=5, max_items=32)
        await asyncio.gather(*(coalescer.add(item(i)) for i in range(20)))
        assert packages.written == [[f"job_{i}" for i in range(20)]]

    async def test_a_full_group_goes_out_at_once_and_groups_never_mix(self) -> None:
        packages = Packages()
        coalescer = Coalescer(packages, window_ms=10_000, max_items=4)
        adds = [coalescer.add(item(i)) for i in range(8)] + [coalescer.add(item(99, model="other"))]
        done, pending = await asyncio.wait([asyncio.ensure_future(a) for a in adds], timeout=1)
        # Two full groups went out at once; the "other" model has no traffic, so no wait either.
        assert len(done) == 9 and not pending
        assert sorted(map(len, packages.written)) == [1, 4, 4]
        assert ["job_99"] in packages.written

    async def test_requests_arriving_closer_than_the_window_share_packages(self) -> None:
        packages = Packages()
        coalescer = Coalescer(packages, window_ms=20, max_items=32)
        adds = []
        for i in range(50):  # arrivals 1 ms apart, well inside the window
            adds.append(asyncio.ensure_future(coalescer.add(item(i))))
            await asyncio.sleep(0.001)
        await asyncio.wait_for(asyncio.gather(*adds), 2)
        assert packages.written[0] == ["job_0"]  # no traffic seen yet: no wait
        assert len(packages.written) <= 10  # then the window fills packages
        assert sorted(j for p in packages.written for j in p) == sorted(f"job_{i}" for i in range(50))

    async def test_a_package_is_bounded_in_bytes_as_well_as_items(self) -> None:
        packages = Packages()
        coalescer = Coalescer(packages, window_ms=10_000, max_items=32, max_bytes=10_000)
        big = [WorkItem(id=f"job_{i}", kind=JobKind.embed, body={"model": "m", "input": "x" * 4000},
                        created_at=0.0, deadline_at=1.0) for i in range(5)]  # fmt: skip
        adds = [asyncio.ensure_future(coalescer.add(b)) for b in big[:3]]
        await asyncio.wait_for(asyncio.gather(*adds[:2]), 1)  # the third's 4 kB would not fit
        assert packages.written == [["job_0", "job_1"]] and not adds[2].done()
        await coalescer.aclose()
        assert packages.written == [["job_0", "job_1"], ["job_2"]]
        assert [p for p in split(big, 32, 10_000)] == [big[:2], big[2:4], big[4:]]
        assert [len(p) for p in split(big, 32, 100)] == [1] * 5  # a lone large item still travels

    async def test_a_lone_request_waits_only_the_window(self) -> None:
        coalescer = Coalescer(Packages(), window_ms=2, max_items=32)
        started = time.perf_counter()
        await coalescer.add(item(1))
        assert time.perf_counter() - started < 0.1

    async def test_a_failed_write_reaches_every_waiter(self) -> None:
        coalescer = Coalescer(Packages(fail=True), window_ms=1)
        results = await asyncio.gather(*(coalescer.add(item(i)) for i in range(3)), return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results)

    async def test_made_up_model_names_do_not_grow_its_memory(self) -> None:
        coalescer = Coalescer(Packages(), window_ms=1)
        for n in range(3000):
            await coalescer.add(item(n, model=f"made-up-{n}"))
        assert len(coalescer._last) <= MAX_TRACKED and len(coalescer._gap) <= MAX_TRACKED

    async def test_one_item_the_wire_cannot_carry_fails_alone(self) -> None:
        """Packing must not let one caller's item fail the others': each is written alone."""

        async def refuse_poison(items: Sequence[WorkItem]) -> None:
            if any(i.body["input"] == "poison" for i in items):
                raise ValueError("cannot encode")

        coalescer = Coalescer(refuse_poison, window_ms=5)
        outcomes = await asyncio.gather(
            *(coalescer.add(item(i)) for i in range(5)),
            coalescer.add(
                WorkItem(
                    id="job_p",
                    kind=JobKind.embed,
                    body={"model": "m", "input": "poison"},
                    created_at=0.0,
                    deadline_at=1.0,
                )
            ),  # fmt: skip
            return_exceptions=True,
        )
        assert outcomes[:5] == [None] * 5 and isinstance(outcomes[5], ValueError)


async def packages_queued(client: Client) -> int:
    return int(await client.redis.zcard(client.keys.queue("interactive")))


async def test_concurrent_submits_share_packages_and_keep_their_own_outcomes(
    client: Client, start_worker: WorkerFactory
) -> None:
    texts = [f"fine {i}" for i in range(30)] + ["__poison__", "to be cancelled"]
    ids = await asyncio.gather(*(client.submit("embed", {"model": FIXED, "input": t}) for t in texts))
    assert len(set(ids)) == 32
    assert await packages_queued(client) == 1, "32 concurrent submissions travel as one package"
    await client.cancel(ids[31])
    start_worker()
    results = await client.wait_many(ids, timeout=60)
    assert [r.status for r in results[:30]] == ["succeeded"] * 30
    assert results[30].status == "failed" and results[30].error.type == "model_error"
    assert results[31].status == "cancelled" and results[31].body is None
    vectors = {tuple(r.body["data"][0]["embedding"][:4]) for r in results[:30]}
    assert len(vectors) == 30, "each job got its own result"


async def test_packed_and_unpacked_jobs_look_the_same_to_a_poller(
    redis_url: str, prefix: str, start_worker: WorkerFactory
) -> None:
    start_worker()
    async with (
        Client(redis_url, prefix=prefix) as packed,
        Client(redis_url, prefix=prefix, coalesce_window_ms=None) as single,
    ):
        a = await packed.submit("embed", {"model": FIXED, "input": "same text"})
        b = await single.submit("embed", {"model": FIXED, "input": "same text"})
        ra, rb = await packed.wait(a, timeout=30), await single.wait(b, timeout=30)
    fields = {"status", "kind", "route", "model", "body", "error", "attempts", "tenant"}
    assert ra.model_dump(include=fields) == rb.model_dump(include=fields)


async def test_idempotent_submissions_return_the_first_job(
    client: Client, start_worker: WorkerFactory
) -> None:
    first = await client.submit("embed", {"model": FIXED, "input": "once"}, idempotency_key="k-1")
    again = await client.submit("embed", {"model": FIXED, "input": "once"}, idempotency_key="k-1")
    other_tenant = await client.submit(
        "embed", {"model": FIXED, "input": "once"}, idempotency_key="k-1", tenant="b"
    )
    assert first == again != other_tenant
    with pytest.raises(Exception, match="idempotency_key"):
        await client.submit_many([("embed", {"model": FIXED, "input": "x"})], idempotency_key="k-2")
    start_worker()
    assert (await client.wait(first, timeout=30)).status == "succeeded"


async def test_a_package_with_a_poisoned_a_cancelled_and_a_cached_job(
    client: Client, start_worker: WorkerFactory
) -> None:
    seen = {"model": FIXED, "input": "asked before"}
    warm = start_worker(cache_enabled="true")
    first = await client.wait(await client.submit("embed", seen), timeout=30)
    assert first.route == "local"
    warm.stop()  # no worker: the next package waits in the queue while one of its jobs is cancelled
    texts = ["fine one", "__poison__", "asked before", "to be cancelled", "fine two"]
    ids = await asyncio.gather(*(client.submit("embed", {"model": FIXED, "input": t}) for t in texts))
    assert await packages_queued(client) == 1
    await client.cancel(ids[3])
    start_worker(cache_enabled="true")
    results = await client.wait_many(ids, timeout=60)
    assert [r.status for r in results] == ["succeeded", "failed", "succeeded", "cancelled", "succeeded"]
    assert results[1].error.type == "model_error"
    assert results[2].route == "cache" and results[2].body == first.body
    assert [results[0].route, results[4].route] == ["local", "local"]
    assert await client.redis.llen(client.keys.done(ids[3])) == 1


class TestReplies:
    """A client waits for its own jobs on its reply list; the record stays the truth."""

    async def test_results_arrive_on_the_reply_list_in_the_same_step_as_the_record(
        self, client: Client, start_worker: WorkerFactory
    ) -> None:
        job_id = await client.submit("embed", {"model": FIXED, "input": "replied"})
        record = await client.redis.hgetall(client.keys.job(job_id))
        assert record["reply"].startswith(f"{client.keys.root}:reply:")
        start_worker()
        result = await client.wait(job_id, timeout=30)
        assert result.status == "succeeded"
        assert result == await client.get(job_id)  # what the reply carried is the record's envelope

    async def test_a_lost_reply_costs_latency_not_the_result(
        self, client: Client, start_worker: WorkerFactory
    ) -> None:
        job_id = await client.submit("embed", {"model": FIXED, "input": "no reply"})
        await client.redis.hdel(client.keys.job(job_id), "reply")  # the worker will not push one
        start_worker()
        started = time.monotonic()
        result = await client.wait(job_id, timeout=30)
        assert result.status == "succeeded"
        assert time.monotonic() - started < 10  # found by re-reading the record

    async def test_a_record_cannot_point_the_worker_at_another_key(
        self, client: Client, start_worker: WorkerFactory
    ) -> None:
        job_id = await client.submit("embed", {"model": FIXED, "input": "aimed elsewhere"})
        await client.redis.hset(client.keys.job(job_id), "reply", "victim:list")
        start_worker()
        assert (await client.wait(job_id, timeout=30)).status == "succeeded"
        assert await client.redis.exists("victim:list") == 0

    async def test_another_tenant_cannot_wait_on_a_replied_job(
        self, client: Client, start_worker: WorkerFactory
    ) -> None:
        start_worker()
        job_id = await client.submit("embed", {"model": FIXED, "input": "mine"}, tenant="a")
        started = time.monotonic()
        with pytest.raises(JobNotFound):
            await client.wait(job_id, timeout=30, tenant="b")
        assert time.monotonic() - started < 1  # at once: it is not b's job to wait for
        assert (await client.wait(job_id, timeout=30, tenant="a")).status == "succeeded"  # reply kept
