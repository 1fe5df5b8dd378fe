"""Streamed-chat stacks and helpers, shared by test_streaming.py and test_streaming_faults.py.

Two API + worker stacks on the session's Redis and Triton, started once per session: a local
one (SmolLM2 on Triton) and a remote-only one (the fake remote, short idle timeout).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from producer import Client
from stack.processes import python_process
from tests.conftest import Triton, worker_env
from tests.fixtures_api import ApiServer, api_url, start_api
from tests.fixtures_remote import FakeRemote

CHAT_MODEL = "SmolLM2-135M-Instruct"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
IDLE_S = 2  # the remote stack API's idle-stream timeout


# ---------------------------------------------------------------------------- stacks


class Tenants:
    def __init__(self, path: Path, keys: dict[str, str]) -> None:
        self.path = path
        self.keys = keys

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}


@pytest.fixture(scope="session")
def stream_tenants(run_dir: Path) -> Tenants:
    keys = {name: "osk_" + secrets.token_urlsafe(24) for name in ("acme", "globex", "one")}
    limits = {"one": {"max_streams": 1}}
    doc = {
        "tenants": [
            {"name": n, "api_key_sha256": [hashlib.sha256(k.encode()).hexdigest()], **limits.get(n, {})}
            for n, k in keys.items()
        ]
    }
    path = run_dir / "stream-tenants.json"
    path.write_text(json.dumps(doc))
    return Tenants(path, keys)


def _stack(
    run_dir: Path, redis_url: str, triton: Triton, tenants: Tenants, name: str, idle_s: float, **worker: Any
) -> Iterator[ApiServer]:
    prefix = f"t-{name}-" + secrets.token_hex(3)
    env = worker_env(redis_url, triton, prefix, tenants_file=tenants.path, **worker)
    proc = python_process("worker", "workers", run_dir, env, log_name=f"worker-{prefix}").start()
    api = start_api(run_dir, redis_url, prefix, tenants.path, OVERSPILL_STREAM_IDLE_TIMEOUT_S=str(idle_s))
    yield ApiServer(api_url(api), prefix, api, proc)
    api.stop()
    proc.stop()


@pytest.fixture(scope="session")
def local_stack(
    redis_url: str, triton: Triton, run_dir: Path, stream_tenants: Tenants
) -> Iterator[ApiServer]:
    yield from _stack(run_dir, redis_url, triton, stream_tenants, "slocal", 30)


@pytest.fixture(scope="session")
def remote_stack(
    redis_url: str, triton: Triton, run_dir: Path, stream_tenants: Tenants, fake_remote_server: FakeRemote
) -> Iterator[ApiServer]:
    yield from _stack(
        run_dir,
        redis_url,
        triton,
        stream_tenants,
        "sremote",
        IDLE_S,
        gateway_mode="remote",
        remote_base_url=fake_remote_server.base_url,
        remote_max_retries=1,
        remote_backoff_s=0.05,
        remote_circuit_failures=1000,
    )


@pytest.fixture
def remote(fake_remote_server: FakeRemote) -> Iterator[FakeRemote]:
    fake_remote_server.reset()
    yield fake_remote_server
    fake_remote_server.reset()


def sdk(stack: ApiServer, tenants: Tenants, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.url}/v1", api_key=tenants.keys[tenant], max_retries=0, timeout=60
    )


def sync_sdk(stack: ApiServer, tenants: Tenants) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=tenants.keys["acme"], max_retries=0, timeout=60)


def chat(content: str, max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    return {
        "model": CHAT_MODEL,
        "messages": [SYSTEM, {"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


@pytest.fixture
async def stack_client(redis_url: str) -> AsyncIterator[Any]:
    clients: list[Client] = []

    def make(stack: ApiServer) -> Client:
        c = Client(redis_url, prefix=stack.prefix)
        clients.append(c)
        return c

    yield make
    for c in clients:
        await c.aclose()


async def sse_events(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """Every event of an SSE response, parsed (id, event, data)."""
    events: list[dict[str, Any]] = []
    async with http.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        current: dict[str, Any] = {}
        async for line in response.aiter_lines():
            if not line:
                if current:
                    events.append(current)
                current = {}
            elif ":" in line:
                field, _, value = line.partition(":")
                current[field] = json.loads(value.strip()) if field == "data" else value.strip()
    return events


async def job_status(client: Client, job_id: str, timeout: float = 30.0) -> Any:
    return await client.wait(job_id, timeout)


async def first_content(response: httpx.Response) -> str:
    async for line in response.aiter_lines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                return str(chunk["id"])
    raise AssertionError("the stream ended without content")
