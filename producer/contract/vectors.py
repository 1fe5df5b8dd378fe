"""Embedding vectors on the wire: base64 float32 between worker and reader, floats at the edge.

A 384-float vector is 7.7 KB of JSON text; as base64 of its float32 bytes it is 2.0 KB, exact,
and cheaper to write, store and parse. Measured once on ``overspill up`` with the README's bulk
code asking for floats, before and after this module (CPU per item read from /proc): worker
0.23 → 0.17 ms, Redis 0.09 → 0.04 ms, reader 0.12 → 0.09 ms (unpacking is most of what is
left there), 2 900–3 400 → 4 400–5 100 items/s; ``python -m bench p1`` measures that path now.
So every handler writes vectors as base64, and a job whose caller asked for floats
(``encoding_format`` "float", the OpenAI default) has ``packed_vectors`` set on its envelope.
What hands a result to its caller unpacks it first (:func:`read_result` in the client,
:func:`unpack` for webhooks, :func:`unpacked_json` for a dead letter's replay,
:func:`unpack_body` for batch output lines), so callers see the
format they asked for, float for float, bit for bit the same values.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from .envelope import JobResult
from .kinds import JobKind

WIRE_FORMAT = "base64"  # how handlers encode embedding vectors in a stored envelope
PACKED_TAIL = ',"packed_vectors":true}'  # how a packed envelope's JSON ends (the field is last)


def packed(kind: JobKind, request: dict[str, Any], body: dict[str, Any] | None) -> bool | None:
    """``packed_vectors`` for a result: True where the caller asked for floats and the body's
    vectors are base64 (None otherwise, so the envelope leaves the field out)."""
    if kind != JobKind.embed or body is None or request.get("encoding_format", "float") != "float":
        return None
    data = body.get("data")
    if data and isinstance(data[0].get("embedding"), str):
        return True
    return None


def unpack_body(body: dict[str, Any]) -> dict[str, Any]:
    """The body with each base64 vector turned into its list of floats (a new dict)."""
    data = [
        {**entry, "embedding": _floats(entry["embedding"])}
        if isinstance(entry.get("embedding"), str)
        else entry
        for entry in body.get("data", ())
    ]
    return {**body, "data": data}


def unpack(result: JobResult) -> JobResult:
    """``result`` as its caller asked for it: floats where the envelope carries them packed."""
    if not result.packed_vectors or result.body is None:
        return result
    return result.model_copy(update={"body": unpack_body(result.body), "packed_vectors": None})


def read_result(raw: str | bytes) -> JobResult:
    """A stored envelope, validated and unpacked: what a reader hands its caller. The result is
    new and nobody else's, so it is unpacked in place rather than copied."""
    result = JobResult.model_validate_json(raw)
    if result.packed_vectors and result.body is not None:
        result.body = unpack_body(result.body)
        result.packed_vectors = None
    return result


def unpacked_json(raw: str) -> str:
    """A stored envelope's JSON as its caller gets it: the same text unless its vectors are
    packed, else what :func:`unpack` gives, serialized as the worker's webhook sends it."""
    if not raw.endswith(PACKED_TAIL):
        return raw
    return read_result(raw).model_dump_json(exclude_none=True)


def _floats(b64: str) -> list[float]:
    return np.frombuffer(base64.b64decode(b64), dtype="<f4").tolist()  # type: ignore[no-any-return]


def matrix_of(body: dict[str, Any] | None) -> np.ndarray:
    """An embedding response body's vectors as one float32 ``[n, d]`` array, in ``index`` order,
    whether they are base64 (as stored) or floats (as a caller asked): no Python float is made
    for base64 vectors."""
    data = (body or {}).get("data") or []
    if not data:
        return np.zeros((0, 0), dtype=np.float32)
    ordered = sorted(data, key=lambda e: e.get("index", 0)) if len(data) > 1 else data
    first = ordered[0].get("embedding")
    if isinstance(first, str):
        raw = b"".join(base64.b64decode(e["embedding"]) for e in ordered)
        return np.frombuffer(raw, dtype="<f4").reshape(len(ordered), -1)
    return np.asarray([e["embedding"] for e in ordered], dtype=np.float32)
