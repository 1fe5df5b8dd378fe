"""Embedding jobs end to end: Redis → worker → Triton → Redis, with real batching."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from producer import Client, SyncClient
from workers.routing import model_counters

from .conftest import SESSION_PREFIX, Triton

MODEL = "all-MiniLM-L6-v2"


def sentences(n: int) -> list[str]:
    topics = ["rivers", "compilers", "violins", "glaciers", "markets", "comets", "bakeries"]
    return [f"Sentence {i} is about {topics[i % len(topics)]} and number {i * 7}." for i in range(n)]


async def triton_embedding_counts(triton: Triton) -> tuple[float, float]:
    async with httpx.AsyncClient() as http:
        counters = model_counters((await http.get(triton.metrics_url)).text)["embedding"]
    return counters.inferences, counters.executions


async def test_300_concurrent_jobs_succeed_batched_and_match_the_model(
    session_client: Client, triton: Triton, reference_encoder: object
) -> None:
    texts = sentences(300)
    items_before, execs_before = await triton_embedding_counts(triton)
    ids = await asyncio.gather(*(session_client.submit("embed", {"model": MODEL, "input": t}) for t in texts))
    results = await session_client.wait_many(ids, timeout=120)
    await asyncio.sleep(2.5)  # Triton refreshes its metrics about every 2 s
    items_after, execs_after = await triton_embedding_counts(triton)

    assert [r.status for r in results] == ["succeeded"] * 300
    got = np.array([r.body["data"][0]["embedding"] for r in results], dtype=np.float32)
    want, tokens = reference_encoder.encode(texts)  # type: ignore[attr-defined]
    cosine = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.999
    assert [r.body["usage"]["prompt_tokens"] for r in results] == [int(t) for t in tokens]

    assert items_after - items_before >= 300
    assert execs_after - execs_before < (items_after - items_before) / 4, "Triton should run real batches"
    sizes = [r.timings.batch_size for r in results]
    assert max(sizes) > 1
    assert all(r.route == "local" and r.model == MODEL for r in results)
    assert all(r.timings.total_ms >= r.timings.infer_ms > 0 for r in results)


async def test_a_list_input_is_one_job_with_vectors_in_order(
    session_client: Client, reference_encoder: object
) -> None:
    texts = sentences(100)
    job_id = await session_client.submit("embed", {"model": MODEL, "input": texts})
    result = await session_client.wait(job_id, timeout=60)
    assert result.status == "succeeded"
    body = result.body
    assert body is not None and body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == list(range(100))
    want, tokens = reference_encoder.encode(texts)  # type: ignore[attr-defined]
    got = np.array([d["embedding"] for d in body["data"]])
    assert np.abs(got - want).max() < 1e-3
    assert body["usage"] == {"prompt_tokens": int(tokens.sum()), "total_tokens": int(tokens.sum())}


async def test_model_aliases_resolve_to_the_served_name(session_client: Client) -> None:
    job_id = await session_client.submit(
        "embed", {"model": "sentence-transformers/all-MiniLM-L6-v2", "input": "hi"}
    )
    result = await session_client.wait(job_id, timeout=30)
    assert result.status == "succeeded" and result.model == MODEL
    assert len(result.body["data"][0]["embedding"]) == 384


def test_the_sync_client_submits_and_waits(redis_url: str, stack_worker: object) -> None:
    with SyncClient(redis_url, prefix=SESSION_PREFIX) as client:
        job_id = client.submit("embed", {"model": MODEL, "input": "a blocking caller"})
        result = client.wait(job_id, timeout=30)
        assert result.status == "succeeded"
        assert client.get(job_id).status == "succeeded"


async def test_base64_vectors_are_the_float_vectors_packed(session_client: Client) -> None:
    """encoding_format=base64 (the openai SDK's default): little-endian float32, base64."""
    import base64

    text = "the same sentence, two encodings"
    a = await session_client.submit("embed", {"model": MODEL, "input": text})
    b = await session_client.submit("embed", {"model": MODEL, "input": text, "encoding_format": "base64"})
    floats, packed = await session_client.wait(a, timeout=30), await session_client.wait(b, timeout=30)
    encoded = packed.body["data"][0]["embedding"]
    assert isinstance(encoded, str)
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    assert np.array_equal(decoded, np.array(floats.body["data"][0]["embedding"], dtype=np.float32))
