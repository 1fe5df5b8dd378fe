"""Fixtures for the remote side: the fake OpenAI-compatible server, run as a real process.

- ``fake_remote_server``: one ``python -m stack.fake_remote`` per session, on a free port.
- ``fake_remote``: the same server, reset (requests forgotten, faults cleared) for each test.
- ``triton_exec_counts``: Triton's per-model execution counters, to prove what ran there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from stack.processes import ManagedProcess, free_port, python_process
from workers.routing import model_counters


@dataclass
class FakeRemote:
    base_url: str  # what OVERSPILL_REMOTE_BASE_URL points at (…/v1)
    control_url: str
    process: ManagedProcess

    def control(self, **settings: Any) -> dict[str, Any]:
        response = httpx.post(f"{self.control_url}/_control", json=settings, timeout=5)
        response.raise_for_status()
        return dict(response.json())

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.control_url}/_requests", timeout=5)
        response.raise_for_status()
        records = list(response.json())
        return [r for r in records if path is None or r["path"] == path]

    def reset(self) -> None:
        httpx.delete(f"{self.control_url}/_requests", timeout=5).raise_for_status()


def start_fake_remote(run_dir: Path, name: str = "fake-remote") -> FakeRemote:
    """A fake remote process on a free loopback port, answering once ready."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = python_process(
        name, "stack.fake_remote", run_dir, {}, ready_url=f"{url}/_health", args=["--port", str(port)]
    ).start(timeout_s=30)
    return FakeRemote(f"{url}/v1", url, proc)


@pytest.fixture(scope="session")
def fake_remote_server(run_dir: Path) -> Iterator[FakeRemote]:
    remote = start_fake_remote(run_dir)
    yield remote
    remote.process.stop()


@pytest.fixture
def fake_remote(fake_remote_server: FakeRemote) -> Iterator[FakeRemote]:
    fake_remote_server.reset()
    yield fake_remote_server
    fake_remote_server.reset()


def triton_exec_counts(metrics_url: str) -> dict[str, float]:
    """Executions per Triton model so far (``nv_inference_exec_count``)."""
    text = httpx.get(metrics_url, timeout=5).text
    return {model: c.executions for model, c in model_counters(text).items()}
