"""Supervision: `overspill up` restarts what crashes and gives up on a crash loop; stopping
`overspill up` or `overspill triton` leaves no process behind; `/readyz` follows Triton.

Each test runs the real command as a subprocess on free ports with its own run directory,
finds its children in /proc, and is bounded in time.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from producer import Client
from producer.contract import Keys
from stack.processes import ROOT, free_port, python_process, redis_server_binary

FIXED = "fixed-cost"


# ---------------------------------------------------------------------------- /proc


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str
    start: int  # clock ticks after boot: tells a reused pid from the process seen before
    cmdline: str


def processes() -> list[Proc]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        out.append(Proc(int(entry), int(fields[1]), int(fields[2]), fields[0], int(fields[19]), cmdline))
    return out


def child(parent: int, marker: str) -> Proc | None:
    """The live child of ``parent`` whose command line holds ``marker``."""
    found = [p for p in processes() if p.ppid == parent and marker in p.cmdline and p.state != "Z"]
    return found[0] if found else None


def until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not within {timeout}s: {what}")


# ---------------------------------------------------------------------------- the command


@dataclass
class Command:
    """An `overspill` command run as a subprocess; every child it is seen with is remembered."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    groups: dict[int, int] = field(default_factory=dict)  # process group → its leader's start

    def remember(self, p: Proc) -> None:
        if p.pid == p.pgid:
            self.groups[p.pgid] = p.start

    def remember_children(self) -> None:
        for p in processes():
            if p.ppid == self.proc.pid:
                self.remember(p)

    def child(self, marker: str) -> Proc | None:
        found = child(self.proc.pid, marker)
        if found is not None:
            self.remember(found)
        return found

    def wait_for_output(self, text: str, timeout: float) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.err.read_text()[-3000:]}")
            return text in self.out.read_text()

        until(seen, timeout, f"{text!r} on stdout", every=0.2)

    def events(self, event: str) -> list[dict[str, Any]]:
        """The structlog JSON lines on stderr whose event is ``event``."""
        lines = []
        for line in self.err.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == event:
                lines.append(record)
        return lines

    def leftovers(self) -> list[Proc]:
        """Processes alive in the group of a child it was seen with (or, while it runs, its children)."""
        table = processes()
        by_pid = {p.pid: p for p in table}
        # A group whose leader's pid now names another process belongs to that newcomer.
        ours = {g for g, start in self.groups.items() if g not in by_pid or by_pid[g].start == start}
        running = self.proc.poll() is None
        return [
            p
            for p in table
            if p.pid != self.proc.pid
            and p.state != "Z"
            and (p.pgid in ours or (running and p.ppid == self.proc.pid))
        ]


def base_env(run_dir: Path, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "OVERSPILL_RUN_DIR": str(run_dir),
            "OVERSPILL_PREFIX": "t-sup-" + secrets.token_hex(3),
            "OVERSPILL_REDIS_PORT": str(free_port()),
            "OVERSPILL_TRITON_HTTP_PORT": str(free_port()),
            "OVERSPILL_TRITON_GRPC_PORT": str(free_port()),
            "OVERSPILL_TRITON_METRICS_PORT": str(free_port()),
            "OVERSPILL_TRITON_MODELS": '["fixed_cost"]',  # one model: the quickest Triton start
            "OVERSPILL_WORKER_METRICS_PORT": str(free_port()),
            "OVERSPILL_API_PORT": str(free_port()),
            "OVERSPILL_FAKE_REMOTE_PORT": str(free_port()),
            "OVERSPILL_RETRY_BACKOFF_MAX_S": "1",
        }
    )
    env.update(overrides)
    return env


@pytest.fixture
def overspill(tmp_path: Path) -> Iterator[Callable[..., Command]]:
    """Factory: run `overspill ARGS` with an environment; whatever is left is killed afterwards."""
    started: list[Command] = []

    def run(args: list[str], env: dict[str, str]) -> Command:
        n = len(started)
        out, err = tmp_path / f"out-{n}.log", tmp_path / f"err-{n}.log"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stack", *args], stdout=o, stderr=e, env=env, cwd=ROOT
            )
        started.append(Command(proc, out, err))
        return started[-1]

    yield run
    for command in started:
        if command.proc.poll() is None:
            command.remember_children()
            command.proc.kill()
            command.proc.wait()
        for p in command.leftovers():  # a failed test must not leave servers behind
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------- tests


async def test_up_restarts_what_crashes_and_readyz_follows_triton(
    overspill: Callable[..., Command], tmp_path: Path
) -> None:
    """SIGKILLed Triton, worker and Redis come back on their ports and jobs run again; /readyz is
    503 `triton` while Triton is down and 200 again after; SIGTERM stops every child."""
    env = base_env(tmp_path / "run")
    up = overspill(["up"], env)
    up.wait_for_output("overspill is up", timeout=150)
    redis_url = f"redis://127.0.0.1:{env['OVERSPILL_REDIS_PORT']}/0"
    api = f"http://127.0.0.1:{env['OVERSPILL_API_PORT']}"

    def readyz() -> httpx.Response | None:
        try:
            return httpx.get(f"{api}/readyz", timeout=2)
        except httpx.HTTPError:
            return None

    async with Client(redis_url, prefix=env["OVERSPILL_PREFIX"]) as client:

        async def served(tag: str, timeout: float) -> None:
            job = await client.submit("embed", {"model": FIXED, "input": tag}, local_only=True)
            assert (await client.wait(job, timeout=timeout)).status == "succeeded"

        await served("before", 30)
        reports = await client.redis.hgetall(Keys(env["OVERSPILL_PREFIX"]).readiness())
        assert [json.loads(v)["triton_ready"] for v in reports.values()] == [True]
        until(lambda: (r := readyz()) is not None and r.status_code == 200, 15, "/readyz 200 at start")

        # Triton: SIGKILL, then the same ports serve again.
        triton = up.child("tritonserver")
        assert triton is not None
        killed_at = time.monotonic()
        kill(triton.pid)
        down = until(lambda: (r := readyz()) is not None and r.status_code == 503 and r, 15, "/readyz 503")
        body = down.json()
        assert body["error"]["code"] == "not_ready" and "triton" in body["down"]
        again = until(lambda: (p := up.child("tritonserver")) and p.pid != triton.pid and p, 15, "new triton")
        assert f"--grpc-port={env['OVERSPILL_TRITON_GRPC_PORT']}" in again.cmdline
        until(lambda: (r := readyz()) is not None and r.status_code == 200, 90, "/readyz 200 again")
        await served("after triton", 60)
        triton_back_s = time.monotonic() - killed_at
        assert not [p for p in processes() if p.ppid == up.proc.pid and p.state == "Z"], "a zombie is left"

        # A worker: SIGKILL, a new one takes the jobs.
        worker = up.child("-m workers")
        assert worker is not None
        kill(worker.pid)
        until(lambda: (p := up.child("-m workers")) and p.pid != worker.pid, 15, "new worker")
        await served("after worker", 60)

    # Redis: SIGKILL, back on its port with its data (AOF in the same directory).
    r = redis.Redis.from_url(redis_url)
    r.config_set("appendfsync", "always")
    r.set("t-sup:kept", "yes")
    server = up.child("redis-server")
    assert server is not None
    kill(server.pid)
    until(lambda: (p := up.child("redis-server")) and p.pid != server.pid, 15, "new redis")
    assert until(lambda: _get(r, "t-sup:kept"), 15, "redis answers again") == b"yes"
    r.close()

    deaths = {(e["child"], e.get("signal")) for e in up.events("child exited")}
    assert {("triton", "SIGKILL"), ("worker-0", "SIGKILL"), ("redis", "SIGKILL")} <= deaths
    assert {e["child"] for e in up.events("child restarted")} >= {"triton", "worker-0", "redis"}
    print(f"triton killed → serving again in {triton_back_s:.1f}s")

    up.remember_children()
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(timeout=60) == 0
    assert up.leftovers() == []


def _get(r: redis.Redis, key: str) -> bytes | None:
    try:
        value = r.get(key)
    except redis.RedisError:
        return None
    return value if isinstance(value, bytes) else None


def test_sigterm_to_overspill_triton_stops_tritonserver(
    overspill: Callable[..., Command], tmp_path: Path
) -> None:
    triton = overspill(["triton"], base_env(tmp_path / "run"))
    triton.wait_for_output("triton up", timeout=150)
    server = triton.child("tritonserver")
    assert server is not None
    triton.proc.send_signal(signal.SIGTERM)
    assert triton.proc.wait(timeout=30) == 0
    assert triton.leftovers() == [], "tritonserver (or one of its stubs) outlived `overspill triton`"


def test_a_crash_loop_makes_up_exit_non_zero(overspill: Callable[..., Command], tmp_path: Path) -> None:
    """Redis that cannot start again (its AOF is broken): a few quick restarts, then up exits 1."""
    env = base_env(
        tmp_path / "run",
        OVERSPILL_TRITON_URL="127.0.0.1:1",  # not started: this test needs only Redis
        OVERSPILL_TRITON_METRICS_URL="http://127.0.0.1:1/metrics",
        OVERSPILL_WORKERS="0",
        OVERSPILL_API_PORT="0",
        OVERSPILL_FAKE_REMOTE_PORT="0",
        OVERSPILL_RESTART_BACKOFF_S="0.1",
        OVERSPILL_RESTART_MAX="3",
    )
    up = overspill(["up"], env)
    up.wait_for_output("overspill is up", timeout=60)
    server = up.child("redis-server")
    assert server is not None
    aof = tmp_path / "run" / f"redis-{env['OVERSPILL_REDIS_PORT']}" / "appendonlydir"
    (manifest,) = aof.glob("*.manifest")
    manifest.write_text("not a manifest\n")
    started = time.monotonic()
    kill(server.pid)
    assert up.proc.wait(timeout=30) == 1
    stderr = up.err.read_text()
    assert "redis" in stderr and "giving up" in stderr, stderr[-2000:]
    assert [e["child"] for e in up.events("crash loop")] == ["redis"]
    assert len(up.events("child restarted")) == 3
    assert up.leftovers() == []
    assert time.monotonic() - started < 15


async def test_readyz_names_the_part_that_is_down(redis_url: str, tmp_path: Path) -> None:
    """No report yet: ready on Redis alone. A worker that cannot reach Triton: 503 `triton`.
    No worker reporting any more: 503 `workers`. `/healthz` stays 200 throughout."""
    prefix = "t-ready-" + secrets.token_hex(3)
    port = free_port()
    common = {"OVERSPILL_REDIS_URL": redis_url, "OVERSPILL_PREFIX": prefix}
    api_env = {**common, "OVERSPILL_PORT": str(port), "OVERSPILL_AUTH": "off"}
    api = python_process(
        "api", "producer.api", tmp_path, api_env, ready_url=f"http://127.0.0.1:{port}/healthz"
    )
    worker_env = {
        **common,
        "OVERSPILL_TRITON_URL": f"127.0.0.1:{free_port()}",  # nothing listens there
        "OVERSPILL_TRITON_METRICS_URL": f"http://127.0.0.1:{free_port()}/metrics",
        "OVERSPILL_METRICS_PORT": "0",
    }
    worker = python_process("worker", "workers", tmp_path, worker_env)
    url = f"http://127.0.0.1:{port}"

    def down() -> list[str] | None:
        r = httpx.get(f"{url}/readyz", timeout=5)
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        if r.status_code == 200:
            return None
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        return list(r.json()["down"])

    try:
        api.start(timeout_s=30)
        assert down() is None
        worker.start()
        assert until(down, 30, "503 while Triton is unreachable") == ["triton"]
        worker.stop()
        assert until(lambda: down() == ["workers"], 15, "503 once no worker reports")
    finally:
        worker.stop()
        api.stop()


def test_up_never_prints_the_redis_password(overspill: Callable[..., Command], tmp_path: Path) -> None:
    """A Redis of the user's own with a password: not on stdout, stderr, or any process's log."""
    password = "pw-" + secrets.token_hex(8)
    port = free_port()
    data = tmp_path / "own-redis"
    data.mkdir()
    server = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
         "--save", "", "--appendonly", "no", "--requirepass", password],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def answers() -> bool:
            try:
                return bool(redis.Redis(port=port, password=password).ping())
            except redis.RedisError:
                return False

        until(answers, 10, "the password-protected Redis")
        run_dir = tmp_path / "run"
        env = base_env(
            run_dir,
            OVERSPILL_REDIS_URL=f"redis://:{password}@127.0.0.1:{port}/0",
            OVERSPILL_TRITON_URL="127.0.0.1:1",  # not started: the worker only needs to run and log
            OVERSPILL_TRITON_METRICS_URL="http://127.0.0.1:1/metrics",
            OVERSPILL_WORKERS="1",
            OVERSPILL_API_PORT="0",
            OVERSPILL_FAKE_REMOTE_PORT="0",
        )
        up = overspill(["up"], env)
        up.wait_for_output("overspill is up", timeout=60)
        worker_log = run_dir / "worker-0.log"
        until(lambda: worker_log.exists() and "worker started" in worker_log.read_text(), 30, "the worker")
        up.proc.send_signal(signal.SIGINT)
        up.proc.wait(timeout=30)
        printed = {"stdout": up.out.read_text(), "stderr": up.err.read_text()}
        printed |= {p.name: p.read_text(errors="replace") for p in run_dir.glob("*.log")}
        assert "redis://:***@127.0.0.1" in printed["stdout"]
        assert [name for name, text in printed.items() if password in text] == []
    finally:
        server.kill()
        server.wait()
