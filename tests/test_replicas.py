"""Several Triton replicas behind one TritonBackend: balancing, weights, failover, backups.

Two real tritonservers serve the fixed_cost model on loopback; the backend under test runs in
this process, so every request is counted here and on each server's own metrics.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stack.processes import (
    ManagedProcess,
    _http_ok,
    free_port,
    python_process,
    redis_server_binary,
    triton_process,
)
from tests.netns import Host, Network, can_create_namespaces
from workers.backends.local import ReplicaSet, TritonBackend
from workers.core import BackendUnavailable, CircuitState, Endpoint, Role, WorkerConfig, parse_endpoints

MODEL = "fixed_cost"

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


@dataclass
class Replica:
    http: int
    grpc: int
    metrics: int
    process: ManagedProcess
    ms_file: Path
    address: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"{self.address}:{self.grpc}"

    def successes(self) -> float:
        """Requests this server answered (its own nv_inference_request_success)."""
        with urllib.request.urlopen(f"http://{self.address}:{self.metrics}/metrics", timeout=2) as r:
            text = r.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("nv_inference_request_success{") and f'model="{MODEL}"' in line
        )


def _spawn(run_dir: Path, ports: tuple[int, int, int]) -> Replica:
    http, grpc, metrics = ports
    ms_file = run_dir / f"replica_ms-{grpc}"
    ms_file.write_text("50")
    proc = triton_process(
        run_dir, http_port=http, grpc_port=grpc, metrics_port=metrics, models=[MODEL],
        extra_env={"FIXED_COST_MS_FILE": str(ms_file)},
    ).start(wait=False)  # fmt: skip
    return Replica(http, grpc, metrics, proc, ms_file)


@pytest.fixture(scope="module")
def replicas(run_dir: Path) -> Iterator[list[Replica]]:
    servers = [_spawn(run_dir, (free_port(), free_port(), free_port())) for _ in range(2)]
    try:
        for s in servers:
            s.process.wait_ready(120)
        yield servers
    finally:
        for s in servers:
            s.process.stop()


def _restart(run_dir: Path, replica: Replica) -> None:
    fresh = _spawn(run_dir, (replica.http, replica.grpc, replica.metrics))
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
    before = (a.successes(), b.successes())
    backend = TritonBackend(f"{a.url}*3,{b.url}*1")
    try:
        load = await _load(backend, concurrency=16, seconds=3)
    finally:
        await backend.aclose()
    served = (a.successes() - before[0], b.successes() - before[1])
    assert load.failed == 0 and sum(served) == load.ok  # every request counted on a server
    share = served[0] / sum(served)
    assert 0.65 <= share <= 0.85, f"weight 3:1 gave {share:.2f} to the heavier replica"


async def test_the_backup_serves_while_every_primary_is_down_or_the_gate_is_open(
    replicas: list[Replica],
) -> None:
    a, b = replicas
    dead = f"127.0.0.1:{free_port()}"  # a primary nothing listens on
    before = b.successes()
    backend = TritonBackend(f"{a.url},{dead},{b.url}/backup")
    try:
        await backend.ready()  # the probe opens the dead primary's breaker
        up = await _load(backend, concurrency=8, seconds=1)
        assert up.failed == 0 and b.successes() == before  # both primaries' share: none to the backup
        backend.replicas.overflowing = lambda model: model == MODEL  # the gate open, as the router sets it
        spilled = await _load(backend, concurrency=8, seconds=1)
        took = b.successes() - before
        assert spilled.failed == 0 and 0 < took < spilled.ok  # the backup shares with the live primary
        backend.replicas.overflowing = lambda model: False  # closed again: the backup stops
        await _load(backend, concurrency=8, seconds=0.5)
        assert b.successes() - before == took
        before = b.successes()
        a.process.kill()
        a.process.kill_group()
        down = await _load(backend, concurrency=8, seconds=2)
    finally:
        await backend.aclose()
    assert down.failed == 0 and down.ok > 0
    assert b.successes() - before == down.ok


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


# ---------------------------------------------------------------------------- hosts as namespaces


@dataclass
class Cluster:
    net: Network
    redis_url: str
    tritons: dict[str, Host]
    servers: dict[str, Replica]
    worker_host: Host
    api_host: Host


def _in_host(host: Host, proc: ManagedProcess, ready: Any) -> ManagedProcess:
    return ManagedProcess(proc.name, host.exec(proc.cmd), proc.log_path, env=proc.env, ready=ready)


def _bound_to(cmd: list[str], address: str) -> list[str]:
    return [a.replace("127.0.0.1", address) if a.startswith("--") else a for a in cmd]


@pytest.fixture(scope="module")
def cluster(run_dir: Path) -> Iterator[Cluster]:
    if reason := can_create_namespaces():
        pytest.skip(reason)
    started: list[ManagedProcess] = []
    with Network() as net:
        try:
            rh = net.add("redis")
            data = run_dir / f"netns-redis-{net.tag}"
            data.mkdir()
            redis = ManagedProcess(
                "redis",
                rh.exec(
                    [
                        redis_server_binary(),
                        "--port",
                        "6390",
                        "--bind",
                        rh.address,
                        "--dir",
                        str(data),
                        "--save",
                        "",
                        "--protected-mode",
                        "no",
                    ]
                ),
                run_dir / f"netns-redis-{net.tag}.log",
            ).start()
            started.append(redis)
            tritons, servers = {}, {}
            for name in ("t1", "t2"):
                host = net.add(name)
                base = _spawn_cmd(run_dir, name)
                urls = (f"http://{host.address}:8000/v2/health/ready", f"http://{host.address}:8002/metrics")
                proc = ManagedProcess(
                    "triton", host.exec(_bound_to(base.process.cmd, host.address)), base.process.log_path,
                    env=base.process.env, ready=lambda u=urls: all(_http_ok(x) for x in u),
                ).start(wait=False)  # fmt: skip
                started.append(proc)
                tritons[name] = host
                servers[name] = Replica(8000, 8001, 8002, proc, base.ms_file, host.address)
            for s in servers.values():
                s.process.wait_ready(120)
            redis_url = f"redis://{rh.address}:6390/0"
            yield Cluster(net, redis_url, tritons, servers, net.add("w1"), net.add("api"))
        finally:
            for proc in started:
                proc.stop()


def _spawn_cmd(run_dir: Path, name: str) -> Replica:
    """A fixed_cost tritonserver's command line on the standard ports (each host has its own)."""
    ms_file = run_dir / f"netns_ms-{name}-{secrets.token_hex(2)}"
    ms_file.write_text("50")
    proc = triton_process(
        run_dir, http_port=8000, grpc_port=8001, metrics_port=8002, models=[MODEL],
        extra_env={"FIXED_COST_MS_FILE": str(ms_file)},
    )  # fmt: skip
    proc.log_path = run_dir / f"triton-{name}-{ms_file.name}.log"
    return Replica(8000, 8001, 8002, proc, ms_file)


async def test_a_worker_cut_off_from_one_replica_uses_the_other(cluster: Cluster, run_dir: Path) -> None:
    from producer import Client

    t1, t2 = cluster.servers["t1"], cluster.servers["t2"]
    env = {
        "OVERSPILL_REDIS_URL": cluster.redis_url,
        "OVERSPILL_PREFIX": "netns",
        "OVERSPILL_TRITON_URLS": f"{t1.url},{t2.url}",
        "OVERSPILL_TRITON_METRICS_URL": f"http://{t1.address}:8002/metrics,http://{t2.address}:8002/metrics",
        "OVERSPILL_TRITON_TIMEOUT_S": "3",  # a partition shows as a timeout: keep it short
        "OVERSPILL_GATEWAY_MODE": "triton",
        "OVERSPILL_LOG_LEVEL": "INFO",
    }
    base = python_process("worker", "workers", run_dir, env, log_name="worker-netns-w1")
    worker = _in_host(cluster.worker_host, base, None).start()
    try:
        async with Client(cluster.redis_url, prefix="netns") as client:
            warm = await client.submit_many(
                [("embed", {"model": "fixed-cost", "input": f"w{i}"}) for i in range(64)]
            )
            assert all(r.status == "succeeded" for r in await client.wait_many(warm, timeout=30))
            cluster.net.cut(cluster.worker_host, cluster.tritons["t1"])
            cut_at = (t1.successes(), t2.successes())
            ids = await client.submit_many(
                [("embed", {"model": "fixed-cost", "input": f"c{i}"}) for i in range(512)]
            )
            results = await client.wait_many(ids, timeout=40)
            after = (t1.successes(), t2.successes())
            cluster.net.join(cluster.worker_host, cluster.tritons["t1"])
        statuses = [r.status for r in results]
        assert statuses.count("succeeded") == len(ids), {s: statuses.count(s) for s in set(statuses)}
        assert after[0] == cut_at[0] and after[1] > cut_at[1]  # all of it went to the reachable one
    finally:
        worker.stop()


def _cluster_worker(cluster: Cluster, run_dir: Path, host: Host, **extra: str) -> ManagedProcess:
    t1, t2 = cluster.servers["t1"], cluster.servers["t2"]
    env = {
        "OVERSPILL_REDIS_URL": cluster.redis_url,
        "OVERSPILL_PREFIX": "netns-p",
        "OVERSPILL_TRITON_URLS": f"{t1.url},{t2.url}",
        "OVERSPILL_TRITON_METRICS_URL": f"http://{t1.address}:8002/metrics,http://{t2.address}:8002/metrics",
        "OVERSPILL_TRITON_TIMEOUT_S": "3",
        "OVERSPILL_GATEWAY_MODE": "triton",
        "OVERSPILL_PACKAGE_LEASE_S": "3",
        "OVERSPILL_LOG_LEVEL": "INFO",
        **extra,
    }
    base = python_process("worker", "workers", run_dir, env, log_name=f"worker-netns-{host.name}")
    return _in_host(host, base, None).start()


async def test_a_worker_partitioned_from_redis_has_its_packages_rerun_and_resumes_when_healed(
    cluster: Cluster, run_dir: Path
) -> None:
    from producer import Client

    w1 = cluster.worker_host
    w2 = cluster.net.hosts.get("w2") or cluster.net.add("w2")
    for s in cluster.servers.values():
        s.ms_file.write_text("300")  # packages are mid-run when the link goes down
    first = _cluster_worker(cluster, run_dir, w1)
    second = _cluster_worker(cluster, run_dir, w2)
    try:
        async with Client(cluster.redis_url, prefix="netns-p") as client:
            await asyncio.sleep(3)  # both workers up and polling
            ids = await client.submit_many(
                [("embed", {"model": "fixed-cost", "input": f"p{i}"}) for i in range(1024)]
            )
            await asyncio.sleep(1.0)
            cluster.net.partition(w1)
            results = await client.wait_many(ids, timeout=45)
            statuses = [r.status for r in results]
            assert statuses.count("succeeded") == len(ids), {s: statuses.count(s) for s in set(statuses)}
            assert len({r.id for r in results}) == len(ids)
            cluster.net.heal(w1)
            assert second.proc is not None
            second.proc.send_signal(signal.SIGTERM)  # only the healed worker is left to serve
            await asyncio.sleep(2)
            assert first.alive(), "the partitioned worker died instead of waiting out the partition"
            later = await client.submit_many(
                [("embed", {"model": "fixed-cost", "input": f"h{i}"}) for i in range(64)]
            )
            healed = await client.wait_many(later, timeout=30)
        assert all(r.status == "succeeded" for r in healed)
    finally:
        cluster.net.heal(w1)
        for s in cluster.servers.values():
            s.ms_file.write_text("50")
        first.stop()
        second.stop()


def _cluster_api(cluster: Cluster, run_dir: Path, port: int, prefix: str, tenants: Path) -> ManagedProcess:
    """An API process on the API host, bound to the host's address (not loopback)."""
    host = cluster.api_host
    env = {
        "OVERSPILL_REDIS_URL": cluster.redis_url,
        "OVERSPILL_PREFIX": prefix,
        "OVERSPILL_HOST": host.address,
        "OVERSPILL_PORT": str(port),
        "OVERSPILL_TENANTS_FILE": str(tenants),
        "OVERSPILL_SHUTDOWN_DRAIN_S": "1",  # longer than the balancer's 0.25 s health checks
        "OVERSPILL_LOG_LEVEL": "INFO",
    }
    base = python_process("api", "producer.api", run_dir, env, log_name=f"api-netns-{port}")
    url = f"http://{host.address}:{port}/healthz"
    return _in_host(host, base, lambda: _http_ok(url)).start(timeout_s=30)


def _starts(log: Path) -> int:
    return log.read_text().count("worker started") if log.exists() else 0


async def _started(worker: ManagedProcess, seen: int, timeout_s: float = 20.0) -> None:
    """Until the worker's log shows one more start than ``seen`` (the log outlives restarts)."""
    deadline = time.monotonic() + timeout_s
    while _starts(worker.log_path) <= seen:
        assert worker.alive() and time.monotonic() < deadline, f"worker did not start: {worker.log_path}"
        await asyncio.sleep(0.1)


async def test_a_rolling_restart_of_both_workers_and_the_api_under_load_fails_nothing(
    cluster: Cluster, run_dir: Path
) -> None:
    """Two workers and two API processes (as behind a load balancer), each in turn SIGTERMed
    and started again while submissions stream in over HTTP: every job succeeds, once.

    Two API processes, not one: a balancer sends to the one left while the other drains and
    restarts, which is what a rolling restart of a Deployment relies on; with a single process
    the restart would be an outage that clients wait out, not a rolling restart.
    """
    from producer import Client
    from producer.contract import hash_api_key
    from stack.balancer import Balancer

    prefix = "netns-r"
    hosts = [cluster.worker_host, cluster.net.hosts.get("w2") or cluster.net.add("w2")]
    extra = {"OVERSPILL_PREFIX": prefix, "OVERSPILL_SHUTDOWN_GRACE_S": "2"}
    seen = [_starts(run_dir / f"worker-netns-{host.name}.log") for host in hosts]
    workers = [_cluster_worker(cluster, run_dir, host, **extra) for host in hosts]
    key = "osk_" + secrets.token_urlsafe(24)
    tenants = run_dir / f"tenants-{prefix}-{secrets.token_hex(3)}.json"
    load_tenant = {
        "name": "load",
        "api_key_sha256": [hash_api_key(key)],
        "rate_per_s": 10_000,
        "burst": 10_000,
    }
    tenants.write_text(json.dumps({"tenants": [load_tenant]}))
    ports = [8080, 8081]
    apis = [_cluster_api(cluster, run_dir, port, prefix, tenants) for port in ports]
    urls = [f"http://{cluster.api_host.address}:{port}" for port in ports]
    ids: list[str | None] = []
    exits: dict[str, int | None] = {}
    stop = asyncio.Event()
    try:
        for k, w in enumerate(workers):
            await _started(w, seen[k])
        async with Balancer(urls, headers={"Authorization": f"Bearer {key}"}) as lb:

            async def submitter(k: int) -> None:
                for i in range(600):  # bounded in count as well as in time
                    if stop.is_set():
                        return
                    body = {"model": "fixed-cost", "input": f"roll {k} {i}"}
                    ids.append(await lb.submit("embed", body, key=f"{prefix}-{k}-{i}"))

            load = [asyncio.create_task(submitter(k)) for k in range(8)]
            await asyncio.sleep(1.0)
            for k in range(2):  # one at a time: SIGTERM, wait for the exit, start again
                exits[f"worker{k}"] = await workers[k].terminated(15.0)
                before = _starts(workers[k].log_path)
                workers[k] = _cluster_worker(cluster, run_dir, hosts[k], **extra)
                await _started(workers[k], before)
                await asyncio.sleep(0.5)
            for k in range(2):
                exits[f"api{k}"] = await apis[k].terminated(15.0)
                apis[k] = _cluster_api(cluster, run_dir, ports[k], prefix, tenants)
                await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*load)
            stats = lb.stats
        accepted = [i for i in ids if i is not None]
        async with Client(cluster.redis_url, prefix=prefix) as client:
            results = await client.wait_many(accepted, timeout=30)
        statuses = [r.status for r in results]
        print(f"rolling restart: {len(ids)} submissions, {stats}, exits {exits}")
        assert exits == {"worker0": 0, "worker1": 0, "api0": 0, "api1": 0}, exits
        assert stats.failed == 0 and len(accepted) == len(ids) > 500
        assert len(set(accepted)) == len(accepted)  # one job per submission, retries included
        assert statuses.count("succeeded") == len(accepted), {s: statuses.count(s) for s in set(statuses)}
    finally:
        stop.set()
        for proc in [*workers, *apis]:
            proc.stop()
