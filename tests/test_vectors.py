"""Vectors travel as base64 float32 and reach every caller in the format it asked for."""

from __future__ import annotations

import base64

import numpy as np

from producer import Client
from producer.client.arrays import block_of
from producer.contract import JobResult, packed, read_result, unpack, unpacked_json

MODEL = "all-MiniLM-L6-v2"


def b64(values: list[float]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


def test_a_packed_envelope_reads_back_as_the_floats_it_holds() -> None:
    vec = np.float32([0.1, -2.5, 3e-8, 1 / 3])
    body = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": b64(vec.tolist())}]}
    assert packed("embed", {"input": "x"}, body) is True  # floats asked for (the default), base64 held
    assert packed("embed", {"input": "x", "encoding_format": "base64"}, body) is None
    assert packed("rerank", {"query": "q"}, body) is None
    stored = JobResult(
        id="job_x", kind="embed", status="succeeded", created_at=1.0, body=body, packed_vectors=True
    ).model_dump_json(exclude_none=True)
    got = read_result(stored)
    assert got.body["data"][0]["embedding"] == vec.tolist()  # bit for bit the float32 values
    assert got.packed_vectors is None and unpack(got) is got
    assert unpacked_json(stored) == got.model_dump_json(exclude_none=True)  # a replayed webhook's body
    plain = got.model_dump_json(exclude_none=True)
    assert unpacked_json(plain) is plain  # nothing packed: the stored text itself


async def test_float_and_base64_callers_get_the_same_vectors_and_redis_holds_base64(
    session_client: Client,
) -> None:
    text = "one sentence, asked for twice"
    floats_id = await session_client.submit("embed", {"model": MODEL, "input": text})
    b64_id = await session_client.submit(
        "embed", {"model": MODEL, "input": text, "encoding_format": "base64"}
    )
    as_floats, as_b64 = await session_client.wait_many([floats_id, b64_id], timeout=60)

    floats = as_floats.body["data"][0]["embedding"]
    assert isinstance(floats, list) and len(floats) == 384
    assert np.frombuffer(base64.b64decode(as_b64.body["data"][0]["embedding"]), "<f4").tolist() == floats
    stored = await session_client.redis.hget(session_client.keys.job(floats_id), "result")
    assert len(stored) < 3_000, "a 384-float vector is stored as 2 KB of base64, not 7.7 KB of text"


def test_a_block_holds_every_input_row_and_the_jobs_without_vectors_apart() -> None:
    one, two = np.float32([[1, 2, 3]]), np.float32([[4, 5, 6], [7, 8, 9]])

    def envelope(job_id: str, rows: np.ndarray, **extra: object) -> str:
        data = [{"object": "embedding", "index": i, "embedding": b64(r.tolist())} for i, r in enumerate(rows)]
        body = {"object": "list", "data": data[::-1], "usage": {"prompt_tokens": 3 * len(rows)}}  # any order
        return JobResult(
            id=job_id, kind="embed", status="succeeded", created_at=1.0, body=body, route="local", **extra
        ).model_dump_json(exclude_none=True)

    failed = JobResult(
        id="c",
        kind="embed",
        status="failed",
        created_at=1.0,
        error={"type": "invalid_request", "message": "no"},
    )
    block = block_of(
        [("a", envelope("a", one, packed_vectors=True)), ("c", failed), ("b", envelope("b", two))]
    )
    assert block.ids == ["a", "b"] and block.vectors.dtype == np.float32
    assert np.array_equal(block.rows(0), one) and np.array_equal(block.rows(1), two)
    assert block.tokens.tolist() == [3, 6] and block.routes == ["local", "local"]
    assert [r.id for r in block.others] == ["c"] and block.others[0].error.type == "invalid_request"
    assert np.array_equal(read_result(envelope("a", two)).vectors(), two)  # a single result's array


async def test_iter_arrays_gives_the_vectors_iter_results_gives(session_client: Client) -> None:
    texts = [f"sentence number {i} about arrays" for i in range(40)]
    ids = await session_client.submit_many(
        [("embed", {"model": MODEL, "input": t}) for t in texts], lane="bulk"
    )
    rows: dict[str, np.ndarray] = {}
    async for block in session_client.iter_arrays(ids, timeout=120):
        assert not block.others
        rows.update({job_id: block.rows(i) for i, job_id in enumerate(block.ids)})
    assert sorted(rows) == sorted(ids)
    envelopes = {r.id: r for r in await session_client.wait_many(ids, timeout=60)}
    for job_id in ids:
        assert rows[job_id].shape == (1, 384)
        assert rows[job_id][0].tolist() == envelopes[job_id].body["data"][0]["embedding"]
        assert np.array_equal(envelopes[job_id].vectors(), rows[job_id])
