"""Fixtures: real servers, started once per session on free loopback ports.

- ``redis_url``: a private redis-server (the shared one on 6379 is never touched).
- ``triton``: the bundled tritonserver on model_repository/ (all models).
- ``prefix``: a fresh key prefix per test, so tests never see each other's queues or jobs.
- ``start_worker``: factory for worker processes bound to a prefix; stopped after the test.
- ``stack_worker``: one long-lived worker on the session prefix, for tests that only submit.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from producer import Client
from stack.processes import (
    MODEL_REPOSITORY,
    ManagedProcess,
    free_port,
    python_process,
    redis_process,
    start_triton,
)
from stack.processes import TritonServer as Triton

__all__ = ["SESSION_PREFIX", "Triton", "WorkerFactory", "start_triton"]

SESSION_PREFIX = "t-session"

# tests/compose/ builds and runs compose.yaml on a Docker engine of its own: `make compose-test`
# runs it (after `make test`, in CI), with OVERSPILL_COMPOSE_TEST=1.
collect_ignore = [] if os.environ.get("OVERSPILL_COMPOSE_TEST") == "1" else ["compose"]

# An API told to stop keeps serving for its drain (2 s by default) so a load balancer can
# notice; the servers tests start stop at once (test_drain.py sets its own and tests it).
os.environ.setdefault("OVERSPILL_SHUTDOWN_DRAIN_S", "0")


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("run")


@pytest.fixture(scope="session")
def redis_url(run_dir: Path) -> Iterator[str]:
    port = free_port()
    proc = redis_process(port, run_dir, appendonly=False).start()
    yield f"redis://127.0.0.1:{port}/0"
    proc.stop()


@pytest.fixture(scope="session")
def triton(run_dir: Path) -> Iterator[Triton]:
    server = start_triton(run_dir)
    yield server
    server.process.stop()


@pytest.fixture
def prefix() -> str:
    return "t-" + secrets.token_hex(4)


WorkerFactory = Callable[..., ManagedProcess]


def worker_env(redis_url: str, triton: Triton, prefix: str, **overrides: Any) -> dict[str, str]:
    env = {
        "OVERSPILL_REDIS_URL": redis_url,
        "OVERSPILL_PREFIX": prefix,
        "OVERSPILL_TRITON_URL": triton.grpc_url,
        "OVERSPILL_TRITON_METRICS_URL": triton.metrics_url,
        "OVERSPILL_RETRY_BACKOFF_MAX_S": "1",
        "OVERSPILL_LOG_LEVEL": "INFO",
    }
    env.update({f"OVERSPILL_{k.upper()}": str(v) for k, v in overrides.items()})
    return env


@pytest.fixture
def start_worker(redis_url: str, triton: Triton, prefix: str, run_dir: Path) -> Iterator[WorkerFactory]:
    started: list[ManagedProcess] = []

    def factory(*, triton_server: Triton | None = None, **overrides: Any) -> ManagedProcess:
        env = worker_env(redis_url, triton_server or triton, prefix, **overrides)
        name = f"worker-{prefix}-{len(started)}"
        proc = python_process("worker", "workers", run_dir, env, log_name=name).start()
        started.append(proc)
        return proc

    yield factory
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def stack_worker(redis_url: str, triton: Triton, run_dir: Path) -> Iterator[ManagedProcess]:
    env = worker_env(redis_url, triton, SESSION_PREFIX)
    proc = python_process("worker", "workers", run_dir, env, log_name="worker-session").start()
    yield proc
    proc.stop()


@pytest.fixture
async def client(redis_url: str, prefix: str) -> AsyncIterator[Client]:
    async with Client(redis_url, prefix=prefix) as c:
        yield c


@pytest.fixture
async def session_client(redis_url: str, stack_worker: ManagedProcess) -> AsyncIterator[Client]:
    """A client whose jobs the session worker runs."""
    async with Client(redis_url, prefix=SESSION_PREFIX) as c:
        yield c


@pytest.fixture(scope="session")
def minilm() -> ModuleType:
    """The embedding model's ``minilm.py``, loaded by path as the Triton models load it."""
    path = MODEL_REPOSITORY / "embedding" / "1" / "minilm.py"
    spec = importlib.util.spec_from_file_location("reference_minilm", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def reference_encoder(minilm: ModuleType) -> Any:
    """The embedding model's own encoder, run in-process, to check Triton's vectors against."""
    return minilm.MiniLMEncoder()


pytest_plugins = ["tests.fixtures_remote"]
pytest_plugins = [
    *globals().get("pytest_plugins", []),
    "tests.fixtures_api",
    "tests.fixtures_batches",
    "tests.fixtures_streaming",
    "tests.fixtures_console",
]
