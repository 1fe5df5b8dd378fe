"""Batches: the OpenAI Batch API (files, batches, output lines); ``overspill bulk`` is in
test_bulk_cli.py.

Everything real: the API server is a process (``python -m producer.api``) on loopback, the
workers are processes, Redis and Triton are the session's. The official ``openai`` SDK talks to
the API. Volume runs on ``fixed-cost`` (the fast benchmark model); correctness on the real
``all-MiniLM-L6-v2``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis

from producer.contract import Keys, chunk_of
from tests.conftest import Triton
from tests.fixtures_api import TenantKeys
from tests.fixtures_batches import (
    BatchStack,
    assert_exactly_once,
    cosine,
    embed_line,
    full_lines,
    full_lines_one,
    heads,
    jsonl,
    run_batch,
    upload,
    wait_batch,
    wait_for_submitted,
)

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
