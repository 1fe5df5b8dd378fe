"""Blocks: a bulk chunk runs as columns and what each backend batch finished is stored as one
value (a float32 matrix for embeddings, ranked scores for rerank, texts for chat, with indices
and token counts); every job still reads as its own envelope, the same as a job run one by one,
and a row the model rejects fails alone."""

from __future__ import annotations

import base64

import numpy as np

from producer import Client
from producer.contract import DEFAULT_LIMITS, InvalidBody, check_body, chunk_of, locations, parse_body

FIXED = "fixed-cost"
RERANK = "minilm-l6-cosine-rerank"
CHAT = "SmolLM2-135M-Instruct"


def texts(n: int, tag: str) -> list[str]:
    return [f"{tag} {i} " + "word " * (i % 9) for i in range(n)]


async def fields_of(client: Client, chunk_id: str) -> list[str]:
    return list(await client.redis.hkeys(client.keys.chunk(chunk_id)))


async def test_a_chunk_of_texts_is_stored_as_blocks_and_read_as_the_envelopes_of_single_jobs(
    session_client: Client,
) -> None:
    client = session_client
    client.chunk_size = 100
    words = texts(100, "block")
    requests: list[tuple] = [("embed", {"model": FIXED, "input": t}) for t in words]
    requests[7] = ("embed", {"model": FIXED, "input": words[7]}, {"line": "7"})
    ids = await client.submit_many(requests, lane="bulk", tenant="acme", metadata={"run": "b1"})
    results = {r.id: r async for r in client.iter_results(ids, timeout=60, tenant="acme")}
    assert {r.status for r in results.values()} == {"succeeded"}

    chunk_id = chunk_of(ids[0])[0]
    stored = await fields_of(client, chunk_id)
    assert any(f.startswith("b") for f in stored)  # blocks ...
    assert not [f for f in stored if f.startswith("r")]  # ... and no envelope per job
    where = locations(await client.redis.hget(client.keys.chunk(chunk_id), "x"), 100)
    assert (where > 0).all()

    # the same texts run one by one (interactive jobs, a record each) give the same vectors
    singles = await client.wait_many(
        [await client.submit("embed", {"model": FIXED, "input": words[i]}) for i in (0, 7, 99)], timeout=30
    )
    for i, single in zip((0, 7, 99), singles, strict=True):
        block = results[ids[i]]
        assert block.body["data"][0]["embedding"] == single.body["data"][0]["embedding"]
        assert block.body["usage"] == single.body["usage"]
        assert block.model == single.model == FIXED and block.route == "local"
        assert block.attempts == 1 and block.tenant == "acme" and block.kind == "embed"
        assert 0 < block.timings.batch_size and block.timings.queued_ms <= block.timings.total_ms
        assert block.created_at <= block.finished_at
    assert results[ids[7]].metadata == {"run": "b1", "line": "7"}
    assert results[ids[8]].metadata == {"run": "b1"}
    got = await client.get(ids[99], tenant="acme")
    assert got.model_dump(exclude={"timings"}) == results[ids[99]].model_dump(exclude={"timings"})


async def test_base64_callers_get_base64_and_arrays_get_the_same_floats(session_client: Client) -> None:
    client = session_client
    words = texts(60, "b64")
    ids = await client.submit_many(
        [("embed", {"model": FIXED, "input": t, "encoding_format": "base64"}) for t in words], lane="bulk"
    )
    envelopes = {r.id: r async for r in client.iter_results(ids, timeout=60)}
    blocks = [b async for b in client.iter_arrays(ids, timeout=60)]
    rows = {job_id: b.rows(p) for b in blocks for p, job_id in enumerate(b.ids)}
    assert set(rows) == set(ids) and all(b.vectors.dtype == np.float32 for b in blocks)
    for job_id, result in envelopes.items():
        packed = result.body["data"][0]["embedding"]
        assert isinstance(packed, str)
        vector = np.frombuffer(base64.b64decode(packed), dtype="<f4")
        assert np.array_equal(vector, rows[job_id][0])
        assert np.array_equal(result.vectors()[0], vector)
    tokens = {job_id: int(b.tokens[p]) for b in blocks for p, job_id in enumerate(b.ids)}
    assert all(tokens[i] == envelopes[i].body["usage"]["prompt_tokens"] > 0 for i in ids)


async def test_a_row_the_model_rejects_fails_alone_and_its_batch_mates_are_stored(
    session_client: Client,
) -> None:
    client = session_client
    words = texts(50, "mates")
    words[5] = "__poison__"  # the model reports an error for this row only
    words[9] = "__crash__"  # the model fails the whole request: it is split until this row is alone
    ids = await client.submit_many([("embed", {"model": FIXED, "input": t}) for t in words], lane="bulk")
    results = {r.id: r for r in await client.wait_many(ids, timeout=60)}
    failed = {i for i, r in results.items() if r.status != "succeeded"}
    assert failed == {ids[5], ids[9]}
    assert results[ids[5]].error.type == "model_error" and "poisoned" in results[ids[5]].error.message
    assert results[ids[9]].status == "failed" and results[ids[9]].error.message
    assert all(results[i].body["data"][0]["embedding"] for i in ids if i not in failed)
    where = locations(await client.redis.hget(client.keys.chunk(chunk_of(ids[0])[0]), "x"), 50)
    assert where[5] == where[9] == 0xFFFF  # their envelopes are fields of their own
    assert (np.delete(where, [5, 9]) != 0xFFFF).all()


async def test_jobs_of_several_inputs_run_one_by_one_and_read_the_same(session_client: Client) -> None:
    client = session_client
    ids = await client.submit_many(
        [("embed", {"model": FIXED, "input": [f"multi {i}", f"second {i}"]}) for i in range(20)], lane="bulk"
    )
    results = await client.wait_many(ids, timeout=60)
    assert all(r.status == "succeeded" and len(r.body["data"]) == 2 for r in results)
    stored = await fields_of(client, chunk_of(ids[0])[0])
    assert (
        not [f for f in stored if f.startswith("b")] and len([f for f in stored if f.startswith("r")]) == 20
    )


async def test_a_rerank_chunk_is_stored_as_ranked_blocks_that_read_as_single_jobs(
    session_client: Client,
) -> None:
    client = session_client
    docs = [f"doc {j}: " + "lorem ipsum " * (j % 5) for j in range(12)]
    bodies: list[dict] = [
        {"model": RERANK, "query": f"what is doc {i}?", "documents": docs[i % 4 : i % 4 + 6 + i % 3]}
        for i in range(30)
    ]
    for i in range(0, 30, 4):
        bodies[i]["top_n"] = 2
    ids = await client.submit_many([("rerank", b) for b in bodies], lane="bulk", tenant="acme")
    results = {r.id: r for r in await client.wait_many(ids, timeout=60, tenant="acme")}
    assert {r.status for r in results.values()} == {"succeeded"}
    stored = await fields_of(client, chunk_of(ids[0])[0])
    assert any(f.startswith("b") for f in stored) and not [f for f in stored if f.startswith("r")]

    singles = await client.wait_many(
        [await client.submit("rerank", bodies[i], tenant="acme") for i in (0, 1, 29)],
        timeout=30,
        tenant="acme",
    )
    for i, single in zip((0, 1, 29), singles, strict=True):
        block = results[ids[i]]
        assert block.body["id"] == ids[i] and block.kind == "rerank" and block.route == "local"
        assert {k: v for k, v in block.body.items() if k != "id"} == {
            k: v for k, v in single.body.items() if k != "id"
        }
    assert len(results[ids[0]].body["results"]) == 2
    assert len(results[ids[1]].body["results"]) == len(bodies[1]["documents"])


async def test_rerank_jobs_that_want_their_documents_back_run_one_by_one(session_client: Client) -> None:
    client = session_client
    body = {"model": RERANK, "query": "q", "documents": ["a cat", "a dog"], "return_documents": True}
    ids = await client.submit_many([("rerank", body)] * 5, lane="bulk")
    results = await client.wait_many(ids, timeout=60)
    assert all(r.body["results"][0]["document"]["text"] in ("a cat", "a dog") for r in results)
    stored = await fields_of(client, chunk_of(ids[0])[0])
    assert not [f for f in stored if f.startswith("b")] and len([f for f in stored if f.startswith("r")]) == 5


async def test_a_chat_chunk_is_stored_as_text_blocks_that_read_as_single_jobs(session_client: Client) -> None:
    client = session_client
    system = {"role": "system", "content": "You are a concise assistant."}
    bodies = [
        {
            "model": CHAT,
            "messages": [system, {"role": "user", "content": f"Name a colour, number {i}."}],
            "max_tokens": 6,
            "temperature": 0,
        }
        for i in range(6)
    ]
    ids = await client.submit_many([("chat", b) for b in bodies], lane="bulk", metadata={"run": "c"})
    results = {r.id: r for r in await client.wait_many(ids, timeout=180)}
    assert {r.status for r in results.values()} == {"succeeded"}
    stored = await fields_of(client, chunk_of(ids[0])[0])
    assert any(f.startswith("b") for f in stored) and not [f for f in stored if f.startswith("r")]

    single = await client.wait(await client.submit("chat", bodies[3]), timeout=120)
    block = results[ids[3]]
    assert block.body["choices"] == single.body["choices"] and block.body["usage"] == single.body["usage"]
    assert block.body["object"] == "chat.completion" and block.body["id"] == f"chatcmpl-{ids[3]}"
    assert block.metadata == {"run": "c"} and block.timings.batch_size >= 1
    assert abs(block.body["created"] - block.finished_at) < 2


def test_a_bulk_row_is_checked_by_the_same_rules_as_any_body() -> None:
    """The client's quick check of a bulk row accepts and refuses what parse_body does."""
    long = "x" * (DEFAULT_LIMITS.max_input_chars + 1)
    bodies: list[object] = [
        {"model": FIXED, "input": "plain"},
        {"model": FIXED, "input": "plain", "encoding_format": "base64", "user": "u1"},
        {"model": FIXED, "input": "naïve café"},
        {"model": FIXED, "input": "   "},
        {"model": FIXED, "input": ""},
        {"model": FIXED, "input": long},
        {"model": "", "input": "t"},
        {"model": "m" * 201, "input": "t"},
        {"model": FIXED, "input": "t", "encoding_format": "int8"},
        {"model": FIXED, "input": "t", "user": None},
        {"model": FIXED, "input": "t", "user": 5},
        {"model": FIXED, "input": "bad \ud800 surrogate"},
        {"model": FIXED, "input": 12345},
        {"model": FIXED},
        {"model": FIXED, "input": "t", "dimensions": 8},
        ["not", "a", "map"],
    ]
    for body in bodies:
        try:
            parse_body("embed", body)
            expected = None
        except InvalidBody as exc:
            expected = str(exc)
        try:
            check_body("embed", body)
            got = None
        except InvalidBody as exc:
            got = str(exc)
        assert got == expected, body
