"""Several Triton replicas behind one TritonBackend: balancing, weights, failover, backups.

Two real tritonservers serve the fixed_cost model on loopback; the backend under test runs in
this process, so every request is counted here and on each server's own metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stack.processes import (
    ManagedProcess,
    free_port,
    python_process,
)
from tests.replica_servers import MODEL, Replica, spawn_replica
from workers.backends.local import ReplicaSet, TritonBackend
from workers.core import BackendUnavailable, CircuitState, Endpoint, Role, WorkerConfig, parse_endpoints

# ---------------------------------------------------------------------------- pure logic


def test_the_list_form_gives_weights_and_roles_and_a_bare_url_is_a_list_of_one() -> None:
    assert parse_endpoints("10.0.0.2:8001*3, 10.0.0.3:8001*1.5/primary,10.0.0.9:8001/backup") == [
        Endpoint("10.0.0.2:8001", 3.0, Role.primary),
        Endpoint("10.0.0.3:8001", 1.5, Role.primary),
        Endpoint("10.0.0.9:8001", 1.0, Role.backup),
    ]
    assert parse_endpoints("127.0.0.1:8001") == [Endpoint("127.0.0.1:8001")]


@pytest.mark.parametrize("bad", ["", "nohost", "h:port", "h:1*0", "h:1*x", "h:1/spare", "h:1,h:1"])
def test_a_bad_list_is_refused_naming_the_entry(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_endpoints(bad)


def test_triton_urls_replaces_triton_url_and_is_checked_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERSPILL_TRITON_URLS", "a:1*3,b:2/backup")
    assert WorkerConfig().triton_url == "a:1*3,b:2/backup"
    monkeypatch.setenv("OVERSPILL_TRITON_URLS", "a:1/spare")
    with pytest.raises(ValueError, match="a:1/spare"):
        WorkerConfig()


def _offline(spec: str) -> ReplicaSet:
    return ReplicaSet(parse_endpoints(spec), connect=False)


def test_requests_go_to_the_primary_with_least_outstanding_per_weight() -> None:
    rs = _offline("a:1*3,b:1*1")
    a, b = rs.replicas
    picks = []
    for _ in range(8):  # each pick stays outstanding, as concurrent requests would
        r = rs.pick(MODEL)
        assert r is not None
        r.outstanding[MODEL] = r.outstanding.get(MODEL, 0) + 1
        picks.append(r.name)
    assert picks.count("a:1") == 6 and picks.count("b:1") == 2
    assert b.outstanding.get("other", 0) == 0 and rs.pick("other") is a  # counted per model


def test_backups_serve_only_while_no_primary_can() -> None:
    rs = _offline("a:1,b:1,c:1/backup")
    a, b, c = rs.replicas
    assert rs.pick(MODEL) in (a, b)
    a.breaker.trip()
    assert rs.pick(MODEL) is b
    b.breaker.trip()
    assert rs.pick(MODEL) is c
    assert rs.pick(MODEL, exclude={c}) is None


def test_backups_also_serve_while_the_models_overflow_gate_is_open() -> None:
    from workers.routing import Router, RouterConfig, Snapshot

    config = RouterConfig(overflow_pending_enter=32, overflow_pending_leave=8)
    router = Router(config, {"fixed-cost": MODEL, "other": "other_model"})
    rs = ReplicaSet(
        parse_endpoints("a:1,b:1,c:1/backup"), connect=False, overflowing=router.triton_overloaded
    )
    a, b, c = rs.replicas

    def picks(model: str, n: int = 9) -> set[str]:
        chosen = []
        for _ in range(n):  # each stays outstanding, as concurrent requests would
            r = rs.pick(model)
            assert r is not None
            r.outstanding[model] = r.outstanding.get(model, 0) + 1
            chosen.append(r)
        for r in chosen:
            r.outstanding[model] -= 1
        return {r.name for r in chosen}

    assert picks(MODEL) == {"a:1", "b:1"}  # gate closed: primaries only
    router.observe(Snapshot(pending={MODEL: 40.0}))  # saturated: the gate opens
    assert router.overloaded("fixed-cost") and picks(MODEL) == {"a:1", "b:1", "c:1"}
    assert picks("other_model") == {"a:1", "b:1"}  # per model: another model's gate is shut
    router.observe(Snapshot(pending={MODEL: 20.0}))  # between the levels: still open
    assert "c:1" in picks(MODEL)
    router.observe(Snapshot(pending={MODEL: 4.0}))  # at the leave level: closed again
    assert picks(MODEL) == {"a:1", "b:1"}
    a.breaker.trip()
    b.breaker.trip()
    assert picks(MODEL) == {"c:1"}  # every primary down: the backup alone, gate or not


def test_a_tripped_replica_gets_one_trial_after_its_reset_time() -> None:
    now = [0.0]
    rs = ReplicaSet(parse_endpoints("a:1,b:1"), connect=False, reset_after_s=2.0)
    a, b = rs.replicas
    for r in rs.replicas:
        r.breaker._clock = lambda: now[0]  # a controlled clock for the breaker's timing
    a.breaker.trip()
    b.outstanding[MODEL] = 5
    assert rs.pick(MODEL) is b
    now[0] = 2.5
    assert rs.pick(MODEL) is a and a.breaker.state == CircuitState.half_open
    assert rs.pick(MODEL) is b  # the trial is in flight: no second one


# ---------------------------------------------------------------------------- real servers


@pytest.fixture(scope="module")
def replicas(run_dir: Path) -> Iterator[list[Replica]]:
    servers = [spawn_replica(run_dir, (free_port(), free_port(), free_port())) for _ in range(2)]
    try:
        for s in servers:
            s.process.wait_ready(120)
        yield servers
    finally:
        for s in servers:
            s.process.stop()


def _restart(run_dir: Path, replica: Replica) -> None:
    fresh = spawn_replica(run_dir, (replica.http, replica.grpc, replica.metrics))
    fresh.process.wait_ready(120)
    replica.process = fresh.process


@dataclass
class Load:
    ok: int = 0
    failed: int = 0
    items: int = 0


async def _load(backend: TritonBackend, *, concurrency: int, seconds: float, size: int = 8) -> Load:
    """``concurrency`` callers sending ``size``-item requests back to back for ``seconds``."""
    load = Load()
    end = time.monotonic() + seconds
    texts = [f"t{i}" for i in range(size)]

    async def caller() -> None:
        while time.monotonic() < end:
            try:
                out = await backend.embed(MODEL, texts)
            except BackendUnavailable:
                load.failed += 1
                continue
            assert len(out) == size
            load.ok += 1
            load.items += size

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return load


async def test_two_replicas_serve_at_least_1_6x_one(replicas: list[Replica]) -> None:
    # Each execution sleeps 50 ms (not CPU). 16 callers of 32 items keep every replica's queue
    # deeper than one execution of 64, so a replica is the limit, not this machine's 2 cores.
    one = TritonBackend(replicas[0].url)
    two = TritonBackend(",".join(r.url for r in replicas))
    try:
        single = await _load(one, concurrency=16, seconds=3, size=32)
        double = await _load(two, concurrency=16, seconds=3, size=32)
    finally:
        await one.aclose()
        await two.aclose()
    assert single.failed == double.failed == 0
    ratio = double.items / single.items
    print(f"items/s one={single.items / 3:.0f} two={double.items / 3:.0f} ratio={ratio:.2f}")
    assert ratio >= 1.6


async def test_weights_shape_the_split_within_ten_points(replicas: list[Replica]) -> None:
    a, b = replicas
    before = (a.settled_successes(), b.settled_successes())
    backend = TritonBackend(f"{a.url}*3,{b.url}*1")
    try:
        load = await _load(backend, concurrency=16, seconds=3)
    finally:
        await backend.aclose()
    served = (a.settled_successes() - before[0], b.settled_successes() - before[1])
    assert load.failed == 0 and sum(served) == load.ok  # every request counted on a server
    share = served[0] / sum(served)
    assert 0.65 <= share <= 0.85, f"weight 3:1 gave {share:.2f} to the heavier replica"


async def test_the_backup_serves_while_every_primary_is_down_or_the_gate_is_open(
    replicas: list[Replica],
) -> None:
    a, b = replicas
    dead = f"127.0.0.1:{free_port()}"  # a primary nothing listens on
    before = b.settled_successes()
    backend = TritonBackend(f"{a.url},{dead},{b.url}/backup")
    try:
        await backend.ready()  # the probe opens the dead primary's breaker
        up = await _load(backend, concurrency=8, seconds=1)
        assert up.failed == 0 and b.settled_successes() == before  # both primaries' share: none to the backup
        backend.replicas.overflowing = lambda model: model == MODEL  # the gate open, as the router sets it
        spilled = await _load(backend, concurrency=8, seconds=1)
        took = b.settled_successes() - before
        assert spilled.failed == 0 and 0 < took < spilled.ok  # the backup shares with the live primary
        backend.replicas.overflowing = lambda model: False  # closed again: the backup stops
        await _load(backend, concurrency=8, seconds=0.5)
        assert b.settled_successes() - before == took
        before = b.settled_successes()
        a.process.kill()
        a.process.kill_group()
        down = await _load(backend, concurrency=8, seconds=2)
    finally:
        await backend.aclose()
    assert down.failed == 0 and down.ok > 0
    assert b.settled_successes() - before == down.ok


async def test_killing_a_replica_under_load_fails_nothing_and_traffic_comes_back(
    replicas: list[Replica], run_dir: Path
) -> None:
    a, b = replicas
    if not a.process.alive():
        _restart(run_dir, a)
    backend = TritonBackend(f"{a.url},{b.url}")
    try:
        probe = asyncio.create_task(_probe_loop(backend, 12))
        first = asyncio.create_task(_load(backend, concurrency=16, seconds=2))
        await asyncio.sleep(1)
        a.process.kill()  # mid-request: its in-flight calls are retried on b
        a.process.kill_group()
        during = await first
        _restart(run_dir, a)  # same ports, as a supervisor would
        before = a.successes()
        deadline = time.monotonic() + 6
        after = Load()
        while a.successes() == before and time.monotonic() < deadline:
            step = await _load(backend, concurrency=16, seconds=0.5)
            after.ok += step.ok
            after.failed += step.failed
        probe.cancel()
    finally:
        await backend.aclose()
    assert during.failed == 0 and during.ok > 0
    assert after.failed == 0
    assert a.successes() > before, "traffic did not come back to the restarted replica"


async def _probe_loop(backend: TritonBackend, seconds: float) -> None:
    """The sampler's readiness probe, every 0.5 s as in a worker."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await backend.ready()
        await asyncio.sleep(0.5)


# ---------------------------------------------------------------------------- a worker over both


def _worker(run_dir: Path, redis_url: str, prefix: str, replicas: list[Replica], name: str) -> ManagedProcess:
    env = {
        "OVERSPILL_REDIS_URL": redis_url,
        "OVERSPILL_PREFIX": prefix,
        "OVERSPILL_TRITON_URLS": ",".join(r.url for r in replicas),
        "OVERSPILL_TRITON_METRICS_URL": f"http://127.0.0.1:{replicas[0].metrics}/metrics",
        "OVERSPILL_GATEWAY_MODE": "triton",
        "OVERSPILL_SHUTDOWN_GRACE_S": "0.3",
        "OVERSPILL_PACKAGE_LEASE_S": "30",  # longer than the test: only a re-queue lets work move on
        "OVERSPILL_LOG_LEVEL": "INFO",
    }
    return python_process("worker", "workers", run_dir, env, log_name=f"worker-{prefix}-{name}").start()


async def test_sigterm_drains_a_worker_and_its_packages_run_elsewhere_at_once(
    replicas: list[Replica], run_dir: Path, redis_url: str, prefix: str
) -> None:
    from producer import Client

    for r in replicas:
        if not r.process.alive():
            _restart(run_dir, r)
        r.ms_file.write_text("400")  # slow executions, so packages are mid-run at the signal
    served = replicas[0].successes() + replicas[1].successes()  # earlier tests' requests
    first = _worker(run_dir, redis_url, prefix, replicas, "first")
    second: ManagedProcess | None = None
    try:
        async with Client(redis_url, prefix=prefix) as client:
            ids = await client.submit_many(
                [("embed", {"model": "fixed-cost", "input": f"d{i}"}) for i in range(768)]
            )
            deadline = time.monotonic() + 30
            while (
                replicas[0].successes() + replicas[1].successes() < served + 4 and time.monotonic() < deadline
            ):
                await asyncio.sleep(0.2)
            assert first.proc is not None
            assert await first.terminated(10.0) == 0, "the drained worker did not exit 0"
            second = _worker(run_dir, redis_url, prefix, replicas, "second")
            results = await client.wait_many(ids, timeout=25)  # well inside the 30 s lease
        statuses = [r.status for r in results]
        assert statuses.count("succeeded") == len(ids), {s: statuses.count(s) for s in set(statuses)}
        log = first.log_path.read_text()
        assert "draining" in log and "packages re-queued" in log  # the grace ran out mid-package
        assert "package drained, re-queued" in log  # what was left went back as new packages
        assert second is not None
        assert "split to isolate a crash" not in second.log_path.read_text(), "a drain is not a crash"
    finally:
        for r in replicas:
            r.ms_file.write_text("50")
        first.stop()
        if second is not None:
            second.stop()


async def test_signals_are_read_per_replica_and_combined_per_model(replicas: list[Replica]) -> None:
    from prometheus_client import REGISTRY

    from producer.contract import Keys, Lane
    from producer.contract.redis import connect
    from workers.routing import LocalLoad, Sampler

    for r in replicas:
        if not r.process.alive():
            pytest.skip("a replica is down")
    urls = ",".join(f"http://127.0.0.1:{r.metrics}/metrics" for r in replicas)
    redis = connect("redis://127.0.0.1:1/0")  # unreachable: the sampler's Redis reads are best-effort

    async def ready() -> bool:
        return True

    sampler = Sampler(
        redis=redis, keys=Keys("t-signals"), lanes=[Lane.interactive], backlog=lambda: 0, triton_ready=ready,
        metrics_url=urls, load=LocalLoad(), models=["fixed-cost"], publish=lambda _: None,
    )  # fmt: skip
    backend = TritonBackend(",".join(r.url for r in replicas))
    try:
        await sampler.sample()
        await _load(backend, concurrency=8, seconds=1)
        snap = await sampler.sample()
    finally:
        await backend.aclose()
        await sampler.aclose()
        await redis.aclose()
    assert MODEL in snap.pending and snap.queue_ms.get(MODEL, -1) >= 0
    for r in replicas:
        label = {"replica": f"127.0.0.1:{r.metrics}", "model": MODEL}
        assert REGISTRY.get_sample_value("overspill_triton_queue_ms_per_exec", label) is not None
        assert REGISTRY.get_sample_value("overspill_triton_pending_requests", label) is not None
