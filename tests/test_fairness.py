"""Fair share between tenants within a lane: the claim (``fair_claim.lua``) against real Redis.

A worker's claim serves the tenant with the least service so far, weighted by its share;
within a tenant, packages go first in, first out. A tenant at its cap of items in flight waits
aside; a package whose worker died goes back to its own place in its tenant's line.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from arq.constants import in_progress_key_prefix

from producer import Client
from producer.contract import (
    LUA_FAIR_CLAIM,
    Keys,
    Lane,
    TenantSpec,
    queue_payload,
    read_tenant_load,
)
from workers.queue import SharePublisher

from .conftest import WorkerFactory
from .test_queue import FIXED, started

LANE = Lane.bulk
LEASE_MS = 30_000


class Lane_:
    """One lane's queue, seen as producers and a worker see it."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._claim = redis.register_script(LUA_FAIR_CLAIM)
        self.tenant_of: dict[str, str] = {}

    async def queue(
        self, tenant: str, items: int = 10, *, defer_s: float = 0.0, order_us: int | None = None
    ) -> str:
        async with self.redis.pipeline(transaction=True) as pipe:
            package = queue_payload(
                pipe, self.keys, {"items": []}, LANE, time.time() + 3600,
                tenant=tenant, items=items, defer_s=defer_s, order_us=order_us,
            )  # fmt: skip
            await pipe.execute()
        self.tenant_of[package] = tenant
        return package

    async def claim(self, slots: int = 1, finished: tuple[str, ...] = ()) -> list[str]:
        args = [int(time.time() * 1000), slots, LEASE_MS, in_progress_key_prefix]
        args += [self.keys.fair(LANE), self.keys.shares(), *finished]
        out = await self._claim(keys=[self.keys.queue(LANE)], args=args)
        return [(x.decode() if isinstance(x, bytes) else x) for x in out[0::2]]

    async def finish(self, package: str) -> None:
        """What arq does when a package's run ends: off the queue, in-progress key gone."""
        await self.redis.zrem(self.keys.queue(LANE), package)
        await self.redis.delete(in_progress_key_prefix + package)

    async def tenants(self, n: int) -> list[str]:
        """The tenants of the next ``n`` packages claimed one at a time, each finished at once."""
        order = []
        for _ in range(n):
            (package,) = await self.claim(1)
            await self.finish(package)
            order.append(self.tenant_of[package])
        return order

    async def shares(self, **specs: str) -> None:
        await self.redis.hset(self.keys.shares(), mapping=specs)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def lane(redis: aioredis.Redis, prefix: str) -> Lane_:
    return Lane_(redis, Keys(prefix))


async def test_a_small_tenant_is_served_beside_a_big_backlog_not_after_it(lane: Lane_) -> None:
    for _ in range(200):
        await lane.queue("big")
    for _ in range(3):
        await lane.queue("small")
    order = await lane.tenants(8)
    assert order.count("small") == 3  # all of them within the first few claims
    assert order.index("small") <= 1


async def test_within_a_tenant_packages_go_first_in_first_out(lane: Lane_) -> None:
    queued = [await lane.queue("a") for _ in range(5)]
    await lane.queue("b")
    claimed = []
    for _ in range(6):
        (package,) = await lane.claim(1)
        claimed.append(package)
    assert [p for p in claimed if lane.tenant_of[p] == "a"] == queued


async def test_shares_split_the_service_in_their_ratio(lane: Lane_) -> None:
    await lane.shares(heavy="3|")
    for _ in range(60):
        await lane.queue("heavy")
        await lane.queue("light")
    counts = Counter(await lane.tenants(40))
    assert counts == {"heavy": 30, "light": 10}


async def test_service_counts_items_not_packages(lane: Lane_) -> None:
    for _ in range(20):
        await lane.queue("wide", items=100)
        await lane.queue("narrow", items=10)
    counts = Counter(await lane.tenants(22))
    assert counts["narrow"] >= 9 * counts["wide"]


async def test_a_tenant_at_its_cap_waits_aside_until_one_of_its_packages_ends(lane: Lane_) -> None:
    await lane.shares(capped="1|20")
    for _ in range(5):
        await lane.queue("capped", items=10)
        await lane.queue("other", items=10)
    claimed = await lane.claim(8)
    assert Counter(lane.tenant_of[p] for p in claimed) == {"capped": 2, "other": 5}
    running = [p for p in claimed if lane.tenant_of[p] == "capped"]
    assert await lane.claim(4) == []  # other's line is empty, capped is at its cap
    await lane.finish(running[0])
    again = await lane.claim(4, finished=(running[0],))
    assert [lane.tenant_of[p] for p in again] == ["capped"]
    load = {r.tenant: r for r in await read_tenant_load(lane.redis, lane.keys) if r.lane == LANE}
    assert load["capped"].oldest_wait_s is not None
    assert load["capped"].items_in_flight == 20 and load["capped"].queued_items == 20


async def test_a_package_whose_worker_died_goes_back_to_its_place(lane: Lane_) -> None:
    first, second, third = [await lane.queue("a") for _ in range(3)]
    assert await lane.claim(1) == [first]
    # The worker dies: its in-progress key runs out, the package stays in arq's queue.
    await lane.redis.delete(in_progress_key_prefix + first)
    await lane.redis.zadd(lane.keys.fair(LANE) + "leased", {first: 0})  # its lease is up for a check
    assert await lane.claim(1) == [first]  # before second and third
    assert await lane.claim(2) == [second, third]


async def test_a_package_still_running_past_its_check_keeps_its_lease(lane: Lane_) -> None:
    package = await lane.queue("a")
    assert await lane.claim(1) == [package]
    await lane.redis.zadd(lane.keys.fair(LANE) + "leased", {package: 0})  # the heartbeat kept the key
    assert await lane.claim(1) == []
    load = await read_tenant_load(lane.redis, lane.keys)
    assert [(r.tenant, r.items_in_flight) for r in load if r.lane == LANE] == [("a", 10)]


async def test_a_requeued_package_keeps_its_tenants_order(lane: Lane_) -> None:
    early = time.time_ns() // 1000 - 60_000_000
    later = [await lane.queue("a") for _ in range(3)]
    again = await lane.queue("a", order_us=early)  # the rest of a package that timed out
    assert await lane.claim(2) == [again, later[0]]


async def test_a_deferred_package_is_claimed_only_once_due(lane: Lane_) -> None:
    package = await lane.queue("a", defer_s=0.6)
    assert await lane.claim(1) == []
    await asyncio.sleep(0.7)
    assert await lane.claim(1) == [package]


async def test_finished_packages_leave_nothing_behind(lane: Lane_) -> None:
    for tenant in ("a", "b"):
        await lane.queue(tenant)
    claimed = await lane.claim(4)
    for package in claimed:
        await lane.finish(package)
    assert await lane.claim(1, finished=tuple(claimed)) == []
    f = lane.keys.fair(LANE)
    for name in ("meta", "leased", "queued", "inflight", "active", "t:a", "t:b"):
        assert not await lane.redis.exists(f + name), name


async def test_the_tenants_file_sets_shares_and_caps_without_a_restart(
    redis: aioredis.Redis, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "tenants.json"

    def write(**heavy: Any) -> None:
        specs = [TenantSpec(name="heavy", **heavy), TenantSpec(name="plain")]
        path.write_text(json.dumps({"tenants": [s.model_dump(mode="json") for s in specs]}))

    write(share=3, max_in_flight=500)
    publisher = SharePublisher(redis, Keys(prefix), path)
    await publisher.step()
    assert await redis.hgetall(Keys(prefix).shares()) == {b"heavy": b"3|500"}
    write(share=0.5)
    await publisher.step()
    assert await redis.hgetall(Keys(prefix).shares()) == {b"heavy": b"0.5|"}


async def test_a_small_tenants_jobs_finish_long_before_a_big_backlog_does(
    client: Client, start_worker: WorkerFactory
) -> None:
    """End to end, one worker: tenant B's 256 jobs queued after tenant A's 6 000 finish before
    most of A's (FIFO would finish them last)."""
    body = {"model": FIXED, "input": "x"}
    big = await client.submit_many([("embed", body)] * 6000, lane="bulk", tenant="a")
    small = await client.submit_many([("embed", body)] * 256, lane="bulk", tenant="b")
    await started(start_worker(lanes='["bulk"]'))
    a = sorted([r.finished_at or 0.0 async for r in client.iter_results(big, timeout=300)])
    b = [r.finished_at or 0.0 async for r in client.iter_results(small, timeout=60)]
    assert len(a) == 6000 and len(b) == 256
    assert max(b) < a[len(a) // 2]


async def test_a_package_no_line_knows_is_still_claimed(lane: Lane_) -> None:
    """Queued straight into arq's queue (a producer from before the lines): the sweep finds it."""
    await lane.redis.zadd(lane.keys.queue(LANE), {"pkg_unlined": int(time.time() * 1000)})
    assert await lane.claim(1) == ["pkg_unlined"]
    assert await lane.claim(1) == []  # claimed once: it runs under its in-progress key
