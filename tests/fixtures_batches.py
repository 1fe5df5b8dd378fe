"""Batch tests' servers and helpers: an API (and worker) on a prefix of their own, the official
``openai`` SDK, and readers of output files that check every line arrives exactly once."""

from __future__ import annotations

import asyncio
import json
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from stack.processes import ManagedProcess, python_process
from tests.conftest import Triton, worker_env
from tests.fixtures_api import TenantKeys, api_url, start_api

TERMINAL = {"completed", "failed", "expired", "cancelled"}
HEAD = re.compile(
    rb'^\{"id":"(batch_req_[0-9a-f]+)","custom_id":("(?:[^"\\]|\\.)*"),"response":(null|\{"status_code":(\d+))'
)


# ---------------------------------------------------------------------------- servers


def start_batch_api(
    run_dir: Path, redis_url: str, prefix: str, tenants_file: Path, **env: str
) -> ManagedProcess:
    # JSON bodies stay small (256 KB); batch files (MBs) go through the separate upload limit.
    return start_api(
        run_dir, redis_url, prefix, tenants_file,
        OVERSPILL_FILES_DIR=str(run_dir / f"files-{prefix}"), OVERSPILL_BATCH_POLL_S="0.2", **env,
    )  # fmt: skip


class BatchStack:
    def __init__(self, api: ManagedProcess, prefix: str, worker: ManagedProcess | None) -> None:
        self.api = api
        self.url = api_url(api)
        self.prefix = prefix
        self.worker = worker

    def sdk(self, tenants: TenantKeys, tenant: str = "acme") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=tenants.keys[tenant], max_retries=0, timeout=60
        )


@pytest.fixture(scope="module")
def bulk_stack(redis_url: str, triton: Triton, run_dir: Path, tenants: TenantKeys) -> Iterator[BatchStack]:
    """A worker and an API on their own prefix, for the module."""
    prefix = "t-bulk-" + secrets.token_hex(3)
    env = worker_env(redis_url, triton, prefix, tenants_file=tenants.path)
    worker = python_process("worker", "workers", run_dir, env, log_name=f"worker-{prefix}").start()
    api = start_batch_api(run_dir, redis_url, prefix, tenants.path)
    yield BatchStack(api, prefix, worker)
    api.stop()
    worker.stop()


@pytest.fixture(scope="module")
def idle_stack(redis_url: str, run_dir: Path, tenants: TenantKeys) -> Iterator[BatchStack]:
    """An API on a prefix no worker serves (its jobs stay queued); allows a 2 s window."""
    prefix = "t-bulk-idle-" + secrets.token_hex(3)
    api = start_batch_api(
        run_dir, redis_url, prefix, tenants.path, OVERSPILL_BATCH_WINDOWS=json.dumps({"24h": 86400, "2s": 2})
    )
    yield BatchStack(api, prefix, None)
    api.stop()


# ---------------------------------------------------------------------------- helpers


def embed_line(i: int, model: str = "fixed-cost", tag: str = "r") -> dict[str, Any]:
    return {
        "custom_id": f"{tag}-{i}",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": model, "input": f"request {i} of the nightly run"},
    }


def jsonl(lines: list[Any]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


async def upload(sdk: openai.AsyncOpenAI, data: bytes, name: str = "input.jsonl") -> str:
    file = await sdk.files.create(file=(name, data), purpose="batch")
    return file.id


async def run_batch(sdk: openai.AsyncOpenAI, data: bytes, endpoint: str = "/v1/embeddings", **kw: Any) -> Any:
    file_id = await upload(sdk, data)
    return await sdk.batches.create(
        input_file_id=file_id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window=kw.pop("completion_window", "24h"),  # type: ignore[arg-type]
        **kw,
    )


async def wait_batch(
    sdk: openai.AsyncOpenAI, batch_id: str, timeout: float = 120.0, until: set[str] = TERMINAL
) -> Any:
    deadline = time.monotonic() + timeout
    batch = await sdk.batches.retrieve(batch_id)
    while batch.status not in until:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"batch {batch_id} still {batch.status} after {timeout}s: {batch.request_counts}"
            )
        await asyncio.sleep(0.2)
        batch = await sdk.batches.retrieve(batch_id)
    return batch


async def stream_lines(sdk: openai.AsyncOpenAI, file_id: str | None) -> AsyncIterator[bytes]:
    if file_id is None:
        return
    async with sdk.files.with_streaming_response.content(file_id) as response:
        async for line in response.iter_lines():
            if line:
                yield line.encode()


async def heads(sdk: openai.AsyncOpenAI, file_id: str | None) -> list[tuple[str, str, int | None]]:
    """(line id, custom_id, status_code or None) of every line, read from the line's head only."""
    out = []
    async for line in stream_lines(sdk, file_id):
        m = HEAD.match(line)
        assert m, line[:300]
        out.append((m[1].decode(), json.loads(m[2]), int(m[4]) if m[4] else None))
    return out


async def full_lines(sdk: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    return [json.loads(line) async for line in stream_lines(sdk, file_id)]


def assert_exactly_once(expected: list[str], *line_sets: list[tuple[str, str, int | None]]) -> None:
    seen = [cid for lines in line_sets for _, cid, _ in lines]
    assert len(seen) == len(set(seen)), "a custom_id appears more than once"
    assert sorted(seen) == sorted(expected)
    ids = [rid for lines in line_sets for rid, _, _ in lines]
    assert len(ids) == len(set(ids))


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


async def full_lines_one(sdk: openai.AsyncOpenAI, file_id: str) -> AsyncIterator[dict[str, Any]]:
    async for line in stream_lines(sdk, file_id):
        yield json.loads(line)
        return


async def wait_for_submitted(sdk: openai.AsyncOpenAI, batch_id: str, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        raw = await sdk.batches.with_raw_response.retrieve(batch_id)
        if json.loads(raw.text)["overspill"]["submitted"] >= n:
            return
        assert time.monotonic() < deadline, f"{batch_id} not submitted after {timeout}s"
        await asyncio.sleep(0.1)
