"""Batches: the OpenAI Batch API (files, batches, output lines) and ``overspill bulk``.

Everything real: the API server is a process (``python -m producer.api``) on loopback, the
workers are processes, Redis and Triton are the session's. The official ``openai`` SDK talks to
the API. Volume runs on ``fixed-cost`` (the fast benchmark model); correctness on the real
``all-MiniLM-L6-v2``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis

from producer.contract import Keys, chunk_of
from stack.processes import ROOT, ManagedProcess, python_process
from tests.conftest import Triton, WorkerFactory, worker_env
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


# ---------------------------------------------------------------------------- volume


async def test_20k_embedding_batch_through_the_openai_sdk(
    bulk_stack: BatchStack, tenants: TenantKeys
) -> None:
    """20 000 lines: every custom_id exactly once, all 200, in order of submission."""
    n = 20_000
    data = jsonl([embed_line(i) for i in range(n)])
    async with bulk_stack.sdk(tenants) as sdk:
        started = time.monotonic()
        batch = await run_batch(sdk, data, metadata={"job": "nightly"})
        assert batch.status == "validating"
        assert batch.metadata == {"job": "nightly"}
        done = await wait_batch(sdk, batch.id, timeout=150)
        elapsed = time.monotonic() - started
        assert done.status == "completed", done
        assert done.request_counts.total == n
        assert done.request_counts.completed == n and done.request_counts.failed == 0
        assert done.error_file_id is None
        assert done.in_progress_at and done.finalizing_at and done.completed_at
        output = await heads(sdk, done.output_file_id)
        assert_exactly_once([f"r-{i}" for i in range(n)], output)
        assert {status for _, _, status in output} == {200}
        first = await anext(aiter(full_lines_one(sdk, done.output_file_id)))
        assert first["error"] is None and first["response"]["body"]["object"] == "list"
        assert len(first["response"]["body"]["data"][0]["embedding"]) == 384
        meta = await sdk.files.retrieve(done.output_file_id)
        assert meta.purpose == "batch_output" and meta.bytes > 0
    print(f"\n20k-line batch: {elapsed:.1f}s end to end, {n / elapsed:.0f} items/s")


async def full_lines_one(sdk: openai.AsyncOpenAI, file_id: str) -> AsyncIterator[dict[str, Any]]:
    async for line in stream_lines(sdk, file_id):
        yield json.loads(line)
        return


# ---------------------------------------------------------------------------- correctness


async def test_minilm_batch_results_and_per_line_errors(
    bulk_stack: BatchStack, tenants: TenantKeys, reference_encoder: Any
) -> None:
    """Real vectors for good lines; a bad body (400) and an unknown model (404) in the error file."""
    texts = [f"the {w} sat on the mat" for w in ("cat", "dog", "fox", "owl", "bee", "elk")]
    lines: list[Any] = [
        {
            "custom_id": f"ok-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "all-MiniLM-L6-v2", "input": t},
        }
        for i, t in enumerate(texts)
    ]
    lines.insert(
        2,
        {
            "custom_id": "bad-body",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "all-MiniLM-L6-v2", "input": ""},
        },
    )
    lines.append(
        {
            "custom_id": "no-model",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "no-such-model", "input": "x"},
        }
    )
    async with bulk_stack.sdk(tenants) as sdk:
        batch = await run_batch(sdk, jsonl(lines))
        done = await wait_batch(sdk, batch.id, timeout=60)
        assert done.status == "completed"
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
            8,
            6,
            2,
        )
        output = await full_lines(sdk, done.output_file_id)
        errors = await full_lines(sdk, done.error_file_id)
    assert [o["custom_id"] for o in output] == [f"ok-{i}" for i in range(6)]
    expected, _ = reference_encoder.encode(texts)
    for line, ref in zip(output, expected, strict=True):
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and chunk_of(response["request_id"]) is not None
        body = response["body"]
        assert body["model"] == "all-MiniLM-L6-v2" and body["usage"]["prompt_tokens"] > 0
        assert cosine(body["data"][0]["embedding"], [float(x) for x in ref]) > 0.999
    by_id = {e["custom_id"]: e for e in errors}
    assert set(by_id) == {"bad-body", "no-model"}
    bad = by_id["bad-body"]
    assert bad["error"] is None and bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert "empty" in bad["response"]["body"]["error"]["message"]
    missing = by_id["no-model"]
    assert missing["error"] is None and missing["response"]["status_code"] == 404
    assert missing["response"]["body"]["error"]["code"] == "model_not_found"


async def test_model_failures_use_the_openai_error_shapes(
    bulk_stack: BatchStack, tenants: TenantKeys
) -> None:
    """A request the model rejects is a 400 in ``response.body.error``; a backend failure is ``error``."""
    lines = [embed_line(i, tag="m") for i in range(40)]
    lines[5]["body"]["input"] = "__poison__"  # the fixed-cost model rejects this item
    lines[9]["body"]["input"] = "__crash__"  # the fixed-cost model fails the whole request
    async with bulk_stack.sdk(tenants) as sdk:
        done = await wait_batch(sdk, (await run_batch(sdk, jsonl(lines))).id, timeout=60)
        assert done.status == "completed"
        output = await heads(sdk, done.output_file_id)
        errors = {e["custom_id"]: e for e in await full_lines(sdk, done.error_file_id)}
    assert set(errors) == {"m-5", "m-9"} and len(output) == 38
    poisoned = errors["m-5"]
    assert poisoned["error"] is None and poisoned["response"]["status_code"] == 400
    assert poisoned["response"]["body"]["error"]["code"] == "model_error"
    crashed = errors["m-9"]
    assert crashed["response"] is None and crashed["error"]["code"] and crashed["error"]["message"]


async def test_invalid_files_fail_validation_with_line_numbers(
    bulk_stack: BatchStack, tenants: TenantKeys
) -> None:
    lines: list[Any] = [
        embed_line(0),
        '{"custom_id": "broken", "method": "POST", ',
        embed_line(2),
        embed_line(0),  # duplicate custom_id
        {**embed_line(4), "url": "/v1/chat/completions"},  # not the batch's endpoint
        {**embed_line(5), "url": "/v1/images/generations"},  # not an endpoint at all
        {**embed_line(6), "method": "GET"},
        {**embed_line(7), "body": "text"},
    ]
    async with bulk_stack.sdk(tenants) as sdk:
        batch = await run_batch(sdk, jsonl(lines))
        done = await wait_batch(sdk, batch.id, timeout=30)
        assert done.status == "failed" and done.failed_at
        assert done.output_file_id is None and done.error_file_id is None
        assert done.errors is not None
        got = [(e.line, e.code) for e in done.errors.data]
        assert got == [
            (2, "invalid_json_line"),
            (4, "duplicate_custom_id"),
            (5, "mismatched_url"),
            (6, "invalid_url"),
            (7, "invalid_method"),
            (8, "invalid_body"),
        ]
        assert all(e.message for e in done.errors.data)
        # Requests the API refuses outright, in the OpenAI error shape.
        file_id = await upload(sdk, jsonl([embed_line(0)]))
        with pytest.raises(openai.BadRequestError) as bad_endpoint:
            await sdk.batches.create(
                input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
            )
        assert bad_endpoint.value.body["param"] == "endpoint"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError):
            await sdk.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="1h")  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError):
            await sdk.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
        with pytest.raises(openai.NotFoundError):
            await sdk.batches.create(
                input_file_id="file-nope", endpoint="/v1/embeddings", completion_window="24h"
            )


async def test_lines_the_wire_cannot_carry_fail_alone(bulk_stack: BatchStack, tenants: TenantKeys) -> None:
    """A body no work package can carry fails its own line; a custom_id no record can hold
    fails the file at validation. Neither batch loops: both end."""
    head = '{"custom_id": "%s", "method": "POST", "url": "/v1/embeddings", "body": {"model": "fixed-cost", '
    huge = head % "huge" + '"input": "x", "n": 1' + "0" * 30 + "}}"
    deep = head % "deep" + '"input": "x", "deep": ' + "[" * 70 + "]" * 70 + "}}"
    async with bulk_stack.sdk(tenants) as sdk:
        batch = await run_batch(sdk, jsonl([embed_line(0), huge, deep, embed_line(3)]))
        done = await wait_batch(sdk, batch.id, timeout=60)
        assert done.status == "completed", done
        assert (done.request_counts.completed, done.request_counts.failed) == (2, 2)
        errors = {e["custom_id"]: e for e in await full_lines(sdk, done.error_file_id)}
        assert set(errors) == {"huge", "deep"}
        assert {e["response"]["status_code"] for e in errors.values()} == {400}
        surrogate = head.replace('"%s"', '"\\ud800"') + '"input": "x"}}'
        batch = await run_batch(sdk, jsonl([embed_line(0), surrogate]))
        done = await wait_batch(sdk, batch.id, timeout=30)
        assert done.status == "failed"
        assert [(e.line, e.code) for e in done.errors.data] == [(2, "invalid_value")]


async def test_a_batch_whose_steps_keep_crashing_fails_instead_of_looping(
    idle_stack: BatchStack, tenants: TenantKeys, redis_url: str
) -> None:
    """State corrupted under a running batch (a line entry that is not JSON) fails the batch
    after ``batch_max_step_failures`` steps, with its queued jobs cancelled."""
    async with idle_stack.sdk(tenants) as sdk:
        batch = await run_batch(sdk, jsonl([embed_line(i) for i in range(20)]))
        await wait_for_submitted(sdk, batch.id, 20)
        redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            await redis.lset(Keys(idle_stack.prefix).batch_lines(batch.id), 0, "not json")
        finally:
            await redis.aclose()
        done = await wait_batch(sdk, batch.id, timeout=30)
    assert done.status == "failed"
    assert [e.code for e in done.errors.data] == ["processing_error"]


# ---------------------------------------------------------------------------- cancel, expiry


async def test_cancel_keeps_finished_results(
    bulk_stack: BatchStack, tenants: TenantKeys, triton: Triton
) -> None:
    """Cancel while running: queued jobs are cancelled, finished ones kept, every line once."""
    n = 3000
    triton.set_exec_ms(150)  # ~64 items per 150 ms: the batch takes several seconds
    try:
        async with bulk_stack.sdk(tenants) as sdk:
            batch = await run_batch(sdk, jsonl([embed_line(i, tag="c") for i in range(n)]))
            deadline = time.monotonic() + 60
            while (b := await sdk.batches.retrieve(batch.id)).request_counts.completed < 100:
                assert time.monotonic() < deadline and b.status in ("validating", "in_progress"), b
                await asyncio.sleep(0.1)
            cancelling = await sdk.batches.cancel(batch.id)
            assert cancelling.status == "cancelling" and cancelling.cancelling_at
            done = await wait_batch(sdk, batch.id, timeout=60)
            assert done.status == "cancelled" and done.cancelled_at
            output = await heads(sdk, done.output_file_id)
            errors = await full_lines(sdk, done.error_file_id)
            with pytest.raises(openai.ConflictError):
                await _cancel_finished(sdk)
    finally:
        triton.set_exec_ms(5)
    assert_exactly_once(
        [f"c-{i}" for i in range(n)], output, [(e["id"], e["custom_id"], None) for e in errors]
    )
    assert 100 <= len(output) < n
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert done.request_counts.completed == len(output) and done.request_counts.failed == len(errors)


async def _cancel_finished(sdk: openai.AsyncOpenAI) -> None:
    batch = await run_batch(sdk, jsonl([embed_line(0, tag="f")]))
    await wait_batch(sdk, batch.id, timeout=30)
    await sdk.batches.cancel(batch.id)


async def test_cancel_before_anything_ran(idle_stack: BatchStack, tenants: TenantKeys) -> None:
    async with idle_stack.sdk(tenants) as sdk:
        batch = await run_batch(sdk, jsonl([embed_line(i) for i in range(500)]))
        await wait_for_submitted(sdk, batch.id, 500)
        await sdk.batches.cancel(batch.id)
        done = await wait_batch(sdk, batch.id, timeout=30)
        assert done.status == "cancelled" and done.output_file_id is None
        errors = await full_lines(sdk, done.error_file_id)
    assert sorted(e["custom_id"] for e in errors) == sorted(f"r-{i}" for i in range(500))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}


async def test_expired_window_marks_unfinished_lines(idle_stack: BatchStack, tenants: TenantKeys) -> None:
    async with idle_stack.sdk(tenants) as sdk:
        batch = await run_batch(sdk, jsonl([embed_line(i) for i in range(50)]), completion_window="2s")
        done = await wait_batch(sdk, batch.id, timeout=30)
        assert done.status == "expired" and done.expired_at
        errors = await full_lines(sdk, done.error_file_id)
    assert len(errors) == 50 and {e["error"]["code"] for e in errors} == {"batch_expired"}


async def wait_for_submitted(sdk: openai.AsyncOpenAI, batch_id: str, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        raw = await sdk.batches.with_raw_response.retrieve(batch_id)
        if json.loads(raw.text)["overspill"]["submitted"] >= n:
            return
        assert time.monotonic() < deadline, f"{batch_id} not submitted after {timeout}s"
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------- tenants


async def test_tenants_see_only_their_own(bulk_stack: BatchStack, tenants: TenantKeys) -> None:
    async with bulk_stack.sdk(tenants, "acme") as acme, bulk_stack.sdk(tenants, "globex") as globex:
        batch = await run_batch(acme, jsonl([embed_line(i) for i in range(3)]))
        done = await wait_batch(acme, batch.id, timeout=30)
        for call in (
            lambda: globex.files.retrieve(batch.input_file_id),
            lambda: globex.files.content(batch.input_file_id),
            lambda: globex.files.content(done.output_file_id),
            lambda: globex.batches.retrieve(batch.id),
            lambda: globex.batches.cancel(batch.id),
            lambda: globex.batches.create(
                input_file_id=batch.input_file_id, endpoint="/v1/embeddings", completion_window="24h"
            ),
        ):
            with pytest.raises(openai.NotFoundError):
                await call()
        theirs = [b.id async for b in globex.batches.list(limit=100)]
        assert batch.id not in theirs
        mine = [b.id async for b in acme.batches.list(limit=2)]  # the SDK pages with ``after``
        assert batch.id in mine
    async with openai.AsyncOpenAI(
        base_url=f"{bulk_stack.url}/v1", api_key="osk_wrong", max_retries=0
    ) as nobody:
        with pytest.raises(openai.AuthenticationError):
            await nobody.batches.retrieve(batch.id)


# ---------------------------------------------------------------------------- crashes


async def test_worker_sigkilled_three_times_same_result(
    redis_url: str,
    run_dir: Path,
    tenants: TenantKeys,
    prefix: str,
    start_worker: WorkerFactory,
    triton: Triton,
) -> None:
    n = 6000
    api = start_batch_api(run_dir, redis_url, prefix, tenants.path)
    stack = BatchStack(api, prefix, None)
    triton.set_exec_ms(40)
    try:
        worker = start_worker(job_timeout_s=2)
        async with stack.sdk(tenants) as sdk:
            started = time.monotonic()
            batch = await run_batch(sdk, jsonl([embed_line(i, tag="k") for i in range(n)]))
            kills = 0
            for threshold in (n // 8, n // 3, n // 2):
                deadline = time.monotonic() + 60
                while (b := await sdk.batches.retrieve(batch.id)).request_counts.completed < threshold:
                    assert time.monotonic() < deadline, b
                    await asyncio.sleep(0.05)
                worker.kill()
                kills += 1
                worker = start_worker(job_timeout_s=2)
            done = await wait_batch(sdk, batch.id, timeout=120)
            elapsed = time.monotonic() - started
            assert done.status == "completed", done
            output = await heads(sdk, done.output_file_id)
            errors = await heads(sdk, done.error_file_id)
    finally:
        triton.set_exec_ms(5)
        api.stop()
    assert kills == 3
    assert_exactly_once([f"k-{i}" for i in range(n)], output, errors)
    assert not errors and done.request_counts.completed == n
    print(f"\n{n} lines with 3 worker SIGKILLs: {elapsed:.1f}s")


async def test_api_sigkilled_while_submitting_and_finalizing_resumes(
    redis_url: str, run_dir: Path, tenants: TenantKeys, prefix: str, start_worker: WorkerFactory
) -> None:
    """Kill the API (the batch's driver) mid-submission, and again while finalising: no line lost or doubled."""
    import redis.asyncio as aioredis

    n = 30_000
    # No worker while submitting: the window must let every line be submitted ahead of results.
    env = {
        "OVERSPILL_BATCH_LEASE_S": "1.5",
        "OVERSPILL_BATCH_CHUNK_LINES": "500",
        "OVERSPILL_BATCH_WINDOW_LINES": str(n),
    }
    api = start_batch_api(run_dir, redis_url, prefix, tenants.path, **env)
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            batch = await run_batch(sdk, jsonl([embed_line(i, tag="a") for i in range(n)]))
            await wait_for_submitted(sdk, batch.id, 1)
        api.kill()
        killed_at = int(await r.hget(f"{prefix}:v1:batch:{batch.id}", "submitted") or 0)
        api = start_batch_api(run_dir, redis_url, prefix, tenants.path, **env)
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            await wait_for_submitted(sdk, batch.id, n)
        lines = await r.lrange(f"{prefix}:v1:batch:{batch.id}:lines", 0, -1)
        job_ids = [json.loads(x)[1] for x in lines]
        chunks = [k async for k in r.scan_iter(f"{prefix}:v1:chunk:*", count=5000)]
        jobs = sum([int(await r.hget(k, "n")) for k in chunks])  # the jobs in Redis, all chunked
        assert len(lines) == n and len(set(job_ids)) == n and jobs == n  # no chunk twice
        start_worker()
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            b = await wait_batch(sdk, batch.id, timeout=120, until={"finalizing", *TERMINAL})
        hit_finalizing = b.status == "finalizing"
        if hit_finalizing:
            api.kill()
            api = start_batch_api(run_dir, redis_url, prefix, tenants.path, **env)
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            done = await wait_batch(sdk, batch.id, timeout=60)
            assert done.status == "completed", done
            output = await heads(sdk, done.output_file_id)
            errors = await heads(sdk, done.error_file_id)
    finally:
        api.stop()
        await r.aclose()
    assert 0 < killed_at < n
    assert_exactly_once([f"a-{i}" for i in range(n)], output, errors)
    assert not errors
    print(f"\nAPI killed after {killed_at}/{n} lines submitted; killed while finalizing: {hit_finalizing}")


async def jobs_held(r: aioredis.Redis, prefix: str) -> int:
    """Jobs in Redis: those of its chunks not yet written out (and removed) by their batch."""
    held = 0
    async for key in r.scan_iter(f"{prefix}:v1:chunk:*", count=5000):
        n, written = await r.hmget(key, ["n", "w"])
        held += int(n or 0) - int(written or 0)
    return held


async def test_a_batch_holds_in_redis_only_its_window_of_lines(
    redis_url: str, run_dir: Path, tenants: TenantKeys, prefix: str, start_worker: WorkerFactory
) -> None:
    """Lines are submitted at most a window ahead of those written to the output file, and a
    written line's job leaves Redis (its chunk, once all of its jobs are written): a batch of
    any size holds a bounded share of it."""
    n, window = 5000, 1000
    api = start_batch_api(run_dir, redis_url, prefix, tenants.path, OVERSPILL_BATCH_WINDOW_LINES=str(window))
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            batch = await run_batch(sdk, jsonl([embed_line(i, tag="w") for i in range(n)]))
            await wait_for_submitted(sdk, batch.id, window)
            await asyncio.sleep(1.5)  # several driver steps: no worker, so nothing is written
            held = int(await r.hget(f"{prefix}:v1:batch:{batch.id}", "submitted") or 0)
            start_worker()
            peak_jobs = 0
            deadline = time.monotonic() + 90
            while (b := await sdk.batches.retrieve(batch.id)).status not in TERMINAL:
                assert time.monotonic() < deadline, b
                peak_jobs = max(peak_jobs, await jobs_held(r, prefix))
                await asyncio.sleep(0.1)
            output = await heads(sdk, b.output_file_id)
        left = [k async for k in r.scan_iter(f"{prefix}:v1:*", count=5000) if ":chunk:" in k or ":job:" in k]
    finally:
        api.stop()
        await r.aclose()
    assert held == window
    assert b.status == "completed" and b.request_counts.completed == n
    assert_exactly_once([f"w-{i}" for i in range(n)], output)
    assert 0 < peak_jobs <= window + 1000  # the window, and at most one submission chunk past it
    assert left == [], "every written line's job is gone, and every chunk once all its jobs are"


# ---------------------------------------------------------------------------- CLI


def overspill(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [str(Path(sys.executable).parent / "overspill"), "bulk", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ})


def test_cli_through_the_api_resumes(bulk_stack: BatchStack, tenants: TenantKeys, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([embed_line(i, tag="cli") for i in range(300)]))
    out = tmp_path / "out.jsonl"
    common = [str(source), "-o", str(out), "--api-url", bulk_stack.url, "--api-key", tenants.keys["acme"]]
    first = overspill(*common, "--no-wait")
    assert first.returncode == 0, first.stderr
    batch_id = json.loads(first.stdout)["batch_id"]
    state = json.loads((tmp_path / "out.jsonl.state").read_text())
    assert state["batch_id"] == batch_id and not out.exists()
    second = overspill(*common, "--wait")
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    assert summary["batch_id"] == batch_id and summary["status"] == "completed"
    assert "req" in second.stderr and "local=" in second.stderr  # the progress bar, with routes
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"cli-{i}" for i in range(300))
    assert all(line["response"]["status_code"] == 200 for line in lines)
    third = overspill(*common)
    assert json.loads(third.stdout)["batch_id"] == batch_id


def test_cli_straight_to_redis_resumes(
    bulk_stack: BatchStack, redis_url: str, run_dir: Path, tmp_path: Path
) -> None:
    """No API in the loop: the command drives its own batch; --no-wait then --wait picks it up."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        jsonl(
            [embed_line(i, tag="direct") for i in range(200)]
            + [{**embed_line(999, tag="direct"), "body": {"model": "fixed-cost", "input": []}}]
        )
    )
    out = tmp_path / "out.jsonl"
    files = str(run_dir / f"files-{bulk_stack.prefix}")
    common = [
        str(source),
        "-o",
        str(out),
        "--redis-url",
        redis_url,
        "--prefix",
        bulk_stack.prefix,
        "--files-dir",
        files,
    ]
    first = overspill(*common, "--no-wait")
    assert first.returncode == 0, first.stderr
    batch_id = json.loads(first.stdout)["batch_id"]
    second = overspill(*common)
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    assert summary["batch_id"] == batch_id
    assert summary["request_counts"] == {"total": 201, "completed": 200, "failed": 1}
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 201 and len({line["custom_id"] for line in lines}) == 201
    assert [line["response"]["status_code"] for line in lines if line["custom_id"] == "direct-999"] == [400]
