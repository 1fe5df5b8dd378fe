"""Bad input fails its own job with a clear error, never its batch-mates or the worker."""

from __future__ import annotations

import asyncio

import pytest

from producer import Client, InvalidBody

MODEL = "all-MiniLM-L6-v2"


async def test_bad_jobs_fail_clearly_and_their_batch_mates_succeed(session_client: Client) -> None:
    bad = {
        "empty": {"model": MODEL, "input": "   "},
        "wrong_type": {"model": MODEL, "input": {"text": "not a string"}},
        "unknown_model": {"model": "gpt-unknown", "input": "hello"},
        "too_long": {"model": MODEL, "input": "word " * 10_000},
        "not_an_object": ["model", MODEL],
    }
    good = [{"model": MODEL, "input": f"good sentence {i}"} for i in range(31)]
    ids = await asyncio.gather(
        *(session_client.submit("embed", body, validate=False) for body in [*bad.values(), *good])  # type: ignore[arg-type]
    )
    results = await session_client.wait_many(ids, timeout=60)
    by_case = dict(zip(bad, results[: len(bad)], strict=True))
    assert all(r.status == "failed" for r in by_case.values())
    assert by_case["empty"].error.type == "invalid_request" and "empty" in by_case["empty"].error.message
    assert by_case["wrong_type"].error.type == "invalid_request"
    assert by_case["unknown_model"].error.type == "model_not_found"
    assert "gpt-unknown" in by_case["unknown_model"].error.message
    assert by_case["too_long"].error.type == "limit_exceeded"
    assert by_case["not_an_object"].error.type == "invalid_request"
    assert [r.status for r in results[len(bad) :]] == ["succeeded"] * 31


async def test_the_client_refuses_bad_bodies_before_enqueueing(client: Client) -> None:
    with pytest.raises(InvalidBody, match="empty"):
        await client.submit("embed", {"model": MODEL, "input": ""})
    assert await client.redis.keys(f"{client.keys.root}:*") == []


async def test_inputs_past_the_window_are_truncated_to_256_tokens(
    session_client: Client, reference_encoder: object
) -> None:
    """Like sentence-transformers, the model embeds the first 256 tokens (documented in README)."""
    long_text = " ".join(f"token{i}" for i in range(2000))
    job_id = await session_client.submit("embed", {"model": MODEL, "input": long_text})
    result = await session_client.wait(job_id, timeout=30)
    assert result.status == "succeeded"
    assert result.body["usage"]["prompt_tokens"] == 256


async def test_a_poisoned_item_fails_alone_inside_a_shared_triton_batch(session_client: Client) -> None:
    texts = [f"fine {i}" for i in range(20)] + ["__poison__"] + [f"fine {i}" for i in range(20, 31)]
    ids = await asyncio.gather(
        *(session_client.submit("embed", {"model": "fixed-cost", "input": t}) for t in texts)
    )
    results = await session_client.wait_many(ids, timeout=60)
    assert results[20].status == "failed" and results[20].error.type == "model_error"
    assert [r.status for i, r in enumerate(results) if i != 20] == ["succeeded"] * 31


async def test_a_request_that_crashes_the_model_is_split_until_only_it_fails(session_client: Client) -> None:
    texts = [f"fine {i}" for i in range(10)] + ["__crash__"] + [f"fine {i}" for i in range(10, 31)]
    ids = await asyncio.gather(
        *(session_client.submit("embed", {"model": "fixed-cost", "input": t}) for t in texts)
    )
    results = await session_client.wait_many(ids, timeout=60)
    assert results[10].status == "failed" and results[10].error.type == "inference_failed"
    assert [r.status for i, r in enumerate(results) if i != 10] == ["succeeded"] * 31


async def test_a_result_too_big_to_store_is_refused_before_it_runs(session_client: Client) -> None:
    """2 048 float vectors would store about 16.6 MB: limit_exceeded, with the way out; the
    same request as base64 (4x smaller) runs."""
    inputs = [f"text {i}" for i in range(2048)]
    big = await session_client.submit("embed", {"model": "fixed-cost", "input": inputs})
    small = await session_client.submit(
        "embed", {"model": "fixed-cost", "input": inputs, "encoding_format": "base64"}
    )
    refused, ran = await session_client.wait_many([big, small], timeout=60)
    assert refused.status == "failed" and refused.error is not None
    assert refused.error.type == "limit_exceeded" and "base64" in refused.error.message
    assert refused.timings.batch_size == 0  # refused before any batch carried it
    assert ran.status == "succeeded" and len(ran.body["data"]) == 2048
