"""Redis Sentinel: every process follows a failover without a restart; WAIT trades latency for loss.

A real primary, one replica and three sentinels (``redis-server --sentinel``, quorum 2) run on
free loopback ports in a temp dir. The worker names Sentinel by ``OVERSPILL_REDIS_SENTINELS``,
the client by the ``redis+sentinel://`` URL. Under load the primary is SIGKILLed; Sentinel
promotes the replica; the same worker and client go on, and every accepted job is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from producer import Client
from producer.contract import (
    NotReplicated,
    RedisConnectionSettings,
    connect,
)
from producer.errors import JobNotFound, JobTimeout
from stack.processes import ManagedProcess, free_port, python_process, redis_process, redis_server_binary
from tests.conftest import Triton, worker_env

MASTER = "mymaster"
LOAD_S = 9.0  # submissions run this long in all, the primary dies LOAD_S / 4 in
SUBMITTERS = 16
MODEL = {"model": "fixed-cost"}


# ---------------------------------------------------------------------------- the cluster


class Cluster:
    """Primary, replica, three sentinels; stopped by the fixture.

    With ``password`` the primary and replica require it (``requirepass``, ``masterauth``) and
    the sentinels use it on them (``auth-pass``); with ``sentinel_password`` the sentinels
    require their own (``requirepass``) and use it on each other (``sentinel-pass``).
    """

    def __init__(
        self, run_dir: Path, password: str | None = None, sentinel_password: str | None = None
    ) -> None:
        self.run_dir = run_dir
        self.password, self.sentinel_password = password, sentinel_password
        self.primary_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.primary = self._redis(self.primary_port)
        self.replica = self._redis(self.replica_port)
        self.replica.cmd += ["--replicaof", "127.0.0.1", str(self.primary_port)]
        self.sentinels = [self._sentinel(p) for p in self.sentinel_ports]

    def _redis(self, port: int) -> ManagedProcess:
        proc = redis_process(port, self.run_dir, appendonly=False)
        # A replica's full sync starts at once, not after the 5 s Redis waits by default for
        # more replicas to share a diskless transfer (every fixture waited it out).
        proc.cmd += ["--repl-diskless-sync-delay", "0"]
        if self.password is None:
            return proc
        auth = ["--requirepass", self.password, "--masterauth", self.password]

        def ready() -> bool:
            with contextlib.closing(self._node(port)) as r:
                return bool(r.ping())

        return ManagedProcess(proc.name, [*proc.cmd, *auth], proc.log_path, ready=ready)

    def _node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=self.password, socket_timeout=0.5, decode_responses=True)

    def _sentinel(self, port: int) -> ManagedProcess:
        conf = self.run_dir / f"sentinel-{port}.conf"  # Sentinel rewrites it: must be writable
        auth = ""
        if self.password is not None:
            auth += f"sentinel auth-pass {MASTER} {self.password}\n"
        if self.sentinel_password is not None:
            auth += f"requirepass {self.sentinel_password}\nsentinel sentinel-pass {self.sentinel_password}\n"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.run_dir}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 2\n"
            # 3 s, not 1: on 2 busy cores a sentinel once saw the just-promoted primary as down
            # 2 s after the failover and failed over again, back to the old primary restarted
            # empty a second before (the old primary then never rejoined as a replica).
            f"sentinel down-after-milliseconds {MASTER} 3000\n"
            f"sentinel failover-timeout {MASTER} 5000\n{auth}"
        )
        cmd = [redis_server_binary(), str(conf), "--sentinel"]
        return ManagedProcess(f"sentinel-{port}", cmd, self.run_dir / f"sentinel-{port}.log")

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER}/0"

    @property
    def sentinels_setting(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    def start(self) -> Cluster:
        self.primary.start()
        self.replica.start()
        for s in self.sentinels:
            s.start()
        self._wait(self._settled, 20.0, "sentinels never saw the replica and each other")
        return self

    def _sentinel_client(self, port: int) -> redis.Redis:
        return redis.Redis(
            port=port, password=self.sentinel_password, socket_timeout=0.5, decode_responses=True
        )

    def _settled(self) -> bool:
        with contextlib.closing(self._node(self.replica_port)) as r:
            if r.info("replication").get("master_link_status") != "up":
                return False
        for port in self.sentinel_ports:
            with contextlib.closing(self._sentinel_client(port)) as s:
                state = s.sentinel_master(MASTER)
                if state["num-other-sentinels"] < 2 or state["num-slaves"] < 1:
                    return False
        return True

    def wait_promoted(self, timeout_s: float) -> None:
        self._wait(lambda: self.primary_port_now() == self.replica_port, timeout_s, "no failover")

    def rejoin(self, timeout_s: float) -> None:
        """Start the old primary again as a replica of the new one; return once it is in sync."""
        self.primary.cmd += ["--replicaof", "127.0.0.1", str(self.primary_port_now())]
        self.primary.start()

        def rejoined() -> bool:
            with contextlib.closing(self._node(self.primary_port)) as r:
                return r.info("replication").get("master_link_status") == "up"

        self._wait(rejoined, timeout_s, "the old primary never rejoined as a replica")

    def primary_port_now(self) -> int:
        with contextlib.closing(self._sentinel_client(self.sentinel_ports[0])) as s:
            return int(s.sentinel_get_master_addr_by_name(MASTER)[1])

    def _wait(self, check: object, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, OSError):
                if check():  # type: ignore[operator]
                    return
            time.sleep(0.2)
        raise AssertionError(what)

    def stop(self) -> None:
        for part in [*self.sentinels, self.replica, self.primary]:
            part.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture
def sentinel_worker(
    cluster: Cluster, triton: Triton, prefix: str, tmp_path: Path
) -> Iterator[ManagedProcess]:
    env = worker_env("redis://unused:6379/0", triton, prefix, metrics_port=0)
    env["OVERSPILL_REDIS_SENTINELS"] = cluster.sentinels_setting
    env["OVERSPILL_REDIS_SENTINEL_MASTER"] = MASTER
    proc = python_process("worker", "workers", tmp_path, env, log_name="worker-sentinel").start()
    try:
        yield proc
    finally:
        proc.stop()


# ---------------------------------------------------------------------------- under failover


async def _load(client: Client, cluster: Cluster) -> tuple[list[str], int, dict[str, float]]:
    """Submit for LOAD_S with SUBMITTERS loops, killing the primary a quarter of the way in.

    Returns the accepted ids, the refused submissions, and how long the failover took.
    """
    accepted: list[str] = []
    refused = 0
    timing = {"longest_submit_s": 0.0, "promoted_after_s": 0.0}
    end = time.monotonic() + LOAD_S
    killed_at = time.monotonic() + LOAD_S / 4

    async def submitter(k: int) -> None:
        nonlocal refused
        i = 0
        while time.monotonic() < end:
            i += 1
            t0 = time.monotonic()
            try:
                accepted.append(await client.submit("embed", {**MODEL, "input": f"{k}-{i}"}))
                timing["longest_submit_s"] = max(timing["longest_submit_s"], time.monotonic() - t0)
            except (redis.RedisError, OSError):  # NotReplicated included: never acknowledged
                refused += 1
                await asyncio.sleep(0.05)

    async def killer() -> None:
        await asyncio.sleep(max(0.0, killed_at - time.monotonic()))
        await asyncio.to_thread(cluster.primary.kill)
        # As an orchestrator would, start the dead node again once Sentinel has promoted the
        # replica, as a replica of the primary Sentinel names (WAIT needs one).
        await asyncio.to_thread(cluster.wait_promoted, 15.0)
        timing["promoted_after_s"] = time.monotonic() - killed_at
        await asyncio.to_thread(cluster.rejoin, 15.0)

    await asyncio.gather(killer(), *(submitter(k) for k in range(SUBMITTERS)))
    return accepted, refused, {k: round(v, 2) for k, v in timing.items()}


async def _terminal(client: Client, ids: list[str], timeout_s: float) -> tuple[int, int]:
    """How many of ``ids`` reached a terminal status, and how many records vanished."""
    terminal = vanished = 0
    deadline = time.monotonic() + timeout_s

    async def one(job_id: str) -> None:
        nonlocal terminal, vanished
        try:
            await client.wait(job_id, timeout=max(0.1, deadline - time.monotonic()))
            terminal += 1
        except JobNotFound:
            vanished += 1
        except JobTimeout:
            pass

    await asyncio.gather(*(one(i) for i in ids))
    return terminal, vanished


@pytest.mark.parametrize("wait_replicas", [0, 1], ids=["async-replication", "wait-1-replica"])
async def test_a_failover_under_load_keeps_every_process_and_counts_every_job(
    cluster: Cluster, sentinel_worker: ManagedProcess, wait_replicas: int, prefix: str
) -> None:
    settings = RedisConnectionSettings(wait_replicas=wait_replicas, wait_timeout_ms=500, reconnect_s=10)
    redis_client = connect(cluster.url, settings)
    client = Client(prefix=prefix, redis=redis_client)
    try:
        first = await client.submit("embed", {**MODEL, "input": "before"})
        assert (await client.wait(first, timeout=20)).status == "succeeded"

        accepted, refused, timing = await _load(client, cluster)
        assert cluster.primary_port_now() == cluster.replica_port  # Sentinel promoted the replica

        after = await client.submit("embed", {**MODEL, "input": "after"})  # same client, new primary
        assert (await client.wait(after, timeout=30)).status == "succeeded"  # same worker too
        terminal, vanished = await _terminal(client, accepted, timeout_s=20)
        assert sentinel_worker.alive()
        report = {
            "wait_replicas": wait_replicas,
            "accepted": len(accepted),
            "terminal": terminal,
            "vanished": vanished,
            "refused": refused,
            **timing,
        }
        print("sentinel failover:", json.dumps(report))
        assert len(accepted) > 100  # real load crossed the failover
        if wait_replicas:
            # Every acknowledged submission was on the replica before the primary died.
            assert terminal == len(accepted), report
        else:
            assert terminal + vanished == len(accepted), report  # lost, never stuck
    finally:
        await client.aclose()
        await redis_client.aclose()


async def test_wait_without_a_replica_refuses_the_submission(cluster: Cluster, prefix: str) -> None:
    cluster.replica.kill()
    settings = RedisConnectionSettings(wait_replicas=1, wait_timeout_ms=100)
    redis_client = connect(cluster.url, settings)
    client = Client(prefix=prefix, redis=redis_client, coalesce_window_ms=None)
    try:
        with pytest.raises(NotReplicated, match="0 of 1 replica"):
            await client.submit("embed", {**MODEL, "input": "unreplicated"})
    finally:
        await client.aclose()
        await redis_client.aclose()


async def test_what_wait_costs_per_submission(cluster: Cluster, prefix: str) -> None:
    """Submissions alternate between a WAIT 1 client and a plain one on the same cluster."""
    plain = connect(cluster.url, RedisConnectionSettings())
    waiting = connect(cluster.url, RedisConnectionSettings(wait_replicas=1, wait_timeout_ms=1000))
    clients = [Client(prefix=prefix, redis=r, coalesce_window_ms=None) for r in (plain, waiting)]
    seconds: list[list[float]] = [[], []]
    try:
        for i in range(400):
            for k, client in enumerate(clients):
                t0 = time.perf_counter()
                await client.submit("embed", {**MODEL, "input": f"{k} {i}"})
                seconds[k].append(time.perf_counter() - t0)
    finally:
        for client in clients:
            await client.aclose()
        await plain.aclose()
        await waiting.aclose()
    ms = [sorted(x * 1000 for x in s) for s in seconds]
    report = {
        name: {"median": round(statistics.median(v), 3), "p90": round(v[int(len(v) * 0.9)], 3)}
        for name, v in zip(("plain", "wait_1"), ms, strict=True)
    }
    print("wait cost per submission (ms):", json.dumps(report))
    assert report["wait_1"]["median"] >= report["plain"]["median"]  # WAIT is one more round trip


# ---------------------------------------------------------------------------- with passwords


async def test_password_protected_primary_and_sentinels_across_a_failover(
    tmp_path: Path, triton: Triton, prefix: str
) -> None:
    """Redis and the sentinels each require a password: the worker takes the sentinels' from a
    mounted file, the client from the setting; a client without it is refused by every sentinel."""
    cluster = Cluster(tmp_path, password="redis-pw", sentinel_password="sentinel-pw").start()
    secret = tmp_path / "sentinel-password"
    secret.write_text("sentinel-pw\n")
    env = worker_env("redis://:redis-pw@unused:6379/0", triton, prefix, metrics_port=0)
    env["OVERSPILL_REDIS_SENTINELS"] = cluster.sentinels_setting
    env["OVERSPILL_REDIS_SENTINEL_PASSWORD_FILE"] = str(secret)
    worker = python_process("worker", "workers", tmp_path, env, log_name="worker-sentinel-auth").start()
    hosts = cluster.sentinels_setting
    url = f"redis+sentinel://:redis-pw@{hosts}/{MASTER}/0"
    refused = connect(url, RedisConnectionSettings(reconnect_s=0))
    redis_client = connect(url, RedisConnectionSettings(sentinel_password="sentinel-pw", reconnect_s=10))
    client = Client(prefix=prefix, redis=redis_client)
    try:
        with pytest.raises(redis.RedisError):  # no sentinel answers without its password
            await refused.ping()
        first = await client.submit("embed", {**MODEL, "input": "before"})
        assert (await client.wait(first, timeout=30)).status == "succeeded"
        cluster.primary.kill()
        await asyncio.to_thread(cluster.wait_promoted, 15.0)
        after = await client.submit("embed", {**MODEL, "input": "after"})  # same client, new primary
        assert (await client.wait(after, timeout=30)).status == "succeeded"  # same worker too
        assert worker.alive()
    finally:
        await client.aclose()
        await redis_client.aclose()
        await refused.aclose()
        worker.stop()
        cluster.stop()
