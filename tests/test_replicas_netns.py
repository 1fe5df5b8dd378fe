"""Replicas, workers and an API as hosts in network namespaces: a worker cut off from one
replica, a worker partitioned from Redis, and a rolling restart of workers and the API under
load. Skipped where namespaces cannot be created."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stack.processes import (
    ManagedProcess,
    _http_ok,
    python_process,
    redis_server_binary,
    triton_process,
)
from tests.netns import Host, Network, can_create_namespaces
from tests.replica_servers import MODEL, Replica

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
            cut_at = (t1.settled_successes(), t2.settled_successes())
            ids = await client.submit_many(
                [("embed", {"model": "fixed-cost", "input": f"c{i}"}) for i in range(512)]
            )
            results = await client.wait_many(ids, timeout=40)
            after = (t1.settled_successes(), t2.settled_successes())
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
