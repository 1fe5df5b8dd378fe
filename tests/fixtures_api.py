"""Fixtures for the HTTP API and webhooks, all real processes and servers on loopback.

- ``tenants``: a tenants file with hashed API keys and webhook secrets (the plain keys stay here).
- ``api_stack``: one worker (webhooks allowlisted to the receiver's port on 127.0.0.1, a short
  retry schedule) and one
  API server (``python -m producer.api``) on their own prefix, for the whole session.
- ``idle_api``: an API server on a prefix no worker serves, so its jobs stay queued.
- ``receiver``: our webhook receiver, a real HTTP server that verifies Standard Webhooks
  signatures itself (not with overspill's code), records deliveries, and can be told to
  answer an error, redirect, answer slowly, or be down.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from stack.processes import ManagedProcess, free_port, python_process
from tests.conftest import Triton, worker_env

RETRY_SCHEDULE = "0.5,0.5,1,1,1.5"  # six attempts in about 5 s


# ---------------------------------------------------------------------------- tenants


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass
class TenantKeys:
    path: Path
    keys: dict[str, str]  # tenant → plain API key
    secrets: dict[str, list[str]]  # tenant → its "default" webhook secrets

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}


@pytest.fixture(scope="session")
def tenants(run_dir: Path) -> TenantKeys:
    names = ("acme", "globex", "tiny", "small", "wide", "five", "ops")
    keys = {name: "osk_" + secrets.token_urlsafe(24) for name in names}
    secret_sets = {
        "acme": [new_secret(), new_secret()],
        "globex": [new_secret()],
        "tiny": [],
        "small": [],
        "wide": [],
        "five": [],
        "ops": [],
    }
    # "wide" has room for load tests: they must not meet its rate limit.
    limits = {
        "tiny": {"rate_per_s": 0.5, "burst": 3},
        "small": {"max_queued": 2},
        "wide": {"rate_per_s": 1e4, "burst": 10_000},
        "five": {"max_queued": 5},
        "ops": {"admin": True},  # the console's operator: sees every tenant
    }
    doc = {
        "tenants": [
            {
                "name": name,
                "api_key_sha256": [hashlib.sha256(key.encode()).hexdigest()],
                "webhook_secrets": {"default": secret_sets[name]} if secret_sets[name] else {},
                **limits.get(name, {}),
            }
            for name, key in keys.items()
        ]
    }
    path = run_dir / "tenants.json"
    path.write_text(json.dumps(doc, indent=2))
    return TenantKeys(path, keys, secret_sets)


# ---------------------------------------------------------------------------- servers


@dataclass
class ApiServer:
    url: str
    prefix: str
    process: ManagedProcess
    worker: ManagedProcess | None = None

    def log_text(self) -> str:
        text = self.process.log_path.read_text(errors="replace")
        if self.worker is not None:
            text += self.worker.log_path.read_text(errors="replace")
        return text


def start_api(
    run_dir: Path, redis_url: str, prefix: str, tenants_file: Path, **extra_env: str
) -> ManagedProcess:
    """The API as a real uvicorn process on a free loopback port; ``extra_env`` adds settings."""
    port = free_port()
    env = {
        "OVERSPILL_REDIS_URL": redis_url,
        "OVERSPILL_PREFIX": prefix,
        "OVERSPILL_PORT": str(port),
        "OVERSPILL_TENANTS_FILE": str(tenants_file),
        "OVERSPILL_MAX_BODY_BYTES": str(256 * 1024),
        "OVERSPILL_SYNC_TIMEOUT_S": "60",
        "OVERSPILL_MAX_WAIT_S": "30",
        **extra_env,
    }
    return python_process(
        "api",
        "producer.api",
        run_dir,
        env,
        ready_url=f"http://127.0.0.1:{port}/healthz",
        log_name=f"api-{prefix}",
    ).start(timeout_s=30)


def api_url(proc: ManagedProcess) -> str:
    assert proc.env is not None
    return f"http://127.0.0.1:{proc.env['OVERSPILL_PORT']}"


@contextlib.contextmanager
def api_with_worker(
    run_dir: Path, redis_url: str, prefix: str, tenants_file: Path, worker: dict[str, str], **api_env: str
) -> Iterator[ApiServer]:
    """A worker with the environment ``worker`` and an API on ``prefix``; both stopped after."""
    proc = python_process("worker", "workers", run_dir, worker, log_name=f"worker-{prefix}").start()
    try:
        api = start_api(run_dir, redis_url, prefix, tenants_file, **api_env)
        try:
            yield ApiServer(api_url(api), prefix, api, proc)
        finally:
            api.stop()
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def api_stack(
    redis_url: str, triton: Triton, run_dir: Path, tenants: TenantKeys, receiver: Receiver
) -> Iterator[ApiServer]:
    prefix = "t-api-" + secrets.token_hex(3)
    env = worker_env(
        redis_url,
        triton,
        prefix,
        tenants_file=tenants.path,
        webhook_allow_hosts=f"127.0.0.1:{receiver.port}",  # that port only, not Redis or Triton
        webhook_retry_schedule_s=RETRY_SCHEDULE,
        webhook_jitter=0,
        webhook_timeout_s=3,
    )
    with api_with_worker(run_dir, redis_url, prefix, tenants.path, env) as server:
        yield server


@pytest.fixture(scope="session")
def idle_api(redis_url: str, run_dir: Path, tenants: TenantKeys) -> Iterator[ApiServer]:
    prefix = "t-idle-" + secrets.token_hex(3)
    api = start_api(run_dir, redis_url, prefix, tenants.path)
    yield ApiServer(api_url(api), prefix, api)
    api.stop()


# ---------------------------------------------------------------------------- receiver


def verify_signature(secrets_: list[str], headers: dict[str, str], body: bytes) -> set[str]:
    """The secrets whose Standard Webhooks v1 signature is in ``webhook-signature``.

    Written from the spec, independently of overspill: HMAC-SHA256 keyed with the base64
    part of ``whsec_…`` over ``{webhook-id}.{webhook-timestamp}.{body}``, base64, ``v1,`` prefix.
    """
    msg_id, ts = headers.get("webhook-id", ""), headers.get("webhook-timestamp", "")
    if not msg_id or not ts or abs(time.time() - int(ts)) > 300:
        return set()
    given = {p.split(",", 1)[1] for p in headers.get("webhook-signature", "").split() if p.startswith("v1,")}
    signed = f"{msg_id}.{ts}.".encode() + body
    matched = set()
    for secret in secrets_:
        key = base64.b64decode(secret.removeprefix("whsec_"))
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        if any(hmac.compare_digest(expected, g) for g in given):
            matched.add(secret)
    return matched


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    answered: int

    def json(self) -> Any:
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 256  # a worker opens dozens of connections at once; the default is 5

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a worker that gave up on a slow answer closed the connection: expected here


@dataclass
class Receiver:
    port: int
    deliveries: list[Received] = field(default_factory=list)
    plans: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)  # path → seconds before answering
    active: dict[str, int] = field(default_factory=dict)  # path → requests being answered now
    peak: dict[str, int] = field(default_factory=dict)  # path → most requests answered at once
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def new_path(self) -> str:
        return "/hook/" + secrets.token_hex(4)

    def answer(self, path: str, *responses: int | tuple[int, dict[str, str]]) -> None:
        """Answer the next requests on ``path`` with these statuses, then 200."""
        with self.lock:
            self.plans[path] = [(r, {}) if isinstance(r, int) else r for r in responses]

    def slow(self, path: str, seconds: float) -> None:
        """Answer requests on ``path`` after ``seconds`` (0: at once again); others are unaffected."""
        with self.lock:
            self.delays[path] = seconds

    def _enter(self, path: str) -> float:
        with self.lock:
            self.active[path] = self.active.get(path, 0) + 1
            self.peak[path] = max(self.peak.get(path, 0), self.active[path])
            return self.delays.get(path, 0.0)

    def _leave(self, path: str) -> None:
        with self.lock:
            self.active[path] -= 1

    def on(self, path: str) -> list[Received]:
        with self.lock:
            return [d for d in self.deliveries if d.path == path]

    async def wait_for(self, path: str, count: int, timeout: float = 20.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.on(path)
            if len(got) >= count:
                return got
            await asyncio.sleep(0.05)
        raise AssertionError(f"{path}: {len(self.on(path))} deliveries after {timeout}s, expected {count}")

    def _next(self, path: str) -> tuple[int, dict[str, str]]:
        with self.lock:
            plan = self.plans.get(path) or []
            return plan.pop(0) if plan else (200, {})

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                delay = receiver._enter(self.path)
                try:
                    self._answer(body, delay)
                finally:
                    receiver._leave(self.path)

            def _answer(self, body: bytes, delay: float) -> None:
                time.sleep(delay)  # its own thread: other requests are answered meanwhile
                status, extra = receiver._next(self.path)
                with receiver.lock:
                    receiver.deliveries.append(
                        Received(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            time.time(),
                            status,
                        )
                    )
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", self.port), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def down(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture(scope="session")
def receiver() -> Iterator[Receiver]:
    r = Receiver(free_port())
    r.up()
    yield r
    r.down()


@pytest.fixture
async def http(api_stack: ApiServer) -> Any:
    async with httpx.AsyncClient(base_url=api_stack.url, timeout=60) as client:
        yield client


async def wait_delivery_state(
    http: httpx.AsyncClient, headers: dict[str, str], job_id: str, state: str, timeout: float = 20.0
) -> dict[str, Any]:
    """Poll the job's webhook delivery state until it is ``state`` (bounded)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        r = await http.get(f"/v1/jobs/{job_id}/webhook", headers=headers)
        if r.status_code == 200:
            last = r.json()
            if last["state"] == state:
                return dict(last)
        await asyncio.sleep(0.1)
    raise AssertionError(f"delivery of {job_id} not {state} after {timeout}s: {last}")
