"""Embedding results as arrays: what a bulk caller feeding numpy, Arrow or a vector store wants.

:meth:`Arrays.iter_arrays` hands over each pass of finished jobs as one :class:`VectorBlock`:
the jobs' ids, a float32 ``[rows, dimensions]`` matrix of all their vectors and each job's row
offsets. A stored vector is base64 of its float32 bytes, so a block is made by decoding those
bytes straight into one array: no envelope model, no Python float per value. A job that did
not succeed (or is not an embedding) comes in ``others`` as its full envelope, with its error.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..contract import JobResult, Status, matrix_of, read_result


@dataclass(slots=True)
class VectorBlock:
    """The succeeded embedding jobs of one pass: job ``ids[i]`` has the rows
    ``vectors[offsets[i]:offsets[i + 1]]`` (one per input, in input order); ``others`` holds the
    envelopes of the jobs of the pass that have no vectors (failed, cancelled, expired)."""

    ids: list[str]
    vectors: np.ndarray
    offsets: np.ndarray
    tokens: np.ndarray  # prompt tokens per job
    routes: list[str]
    others: list[JobResult] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def rows(self, position: int) -> np.ndarray:
        return self.vectors[self.offsets[position] : self.offsets[position + 1]]


_VECTOR, _TOKENS, _ROUTE = '"embedding":"', '"prompt_tokens":', '"route":"'


def _one_vector(envelope: str) -> tuple[bytes, int, str] | None:
    """A succeeded one-input embedding envelope's (vector bytes, prompt tokens, route), read
    from its JSON text without parsing it; None for any other envelope (parsed instead).

    The worker writes envelopes with pydantic, so a quote inside any string value is escaped:
    an unescaped ``"embedding":"`` is the vector's key and nothing else, and base64 holds no
    quote. Usage and route come before ``metadata`` in the text, so their first match is theirs.
    """
    start = envelope.find(_VECTOR)
    if start < 0 or envelope.find(_VECTOR, start + 1) >= 0:
        return None
    start += len(_VECTOR)
    end = envelope.find('"', start)
    at = envelope.find(_TOKENS)
    route_at = envelope.find(_ROUTE)
    if at < 0 or route_at < 0:
        return None
    at += len(_TOKENS)
    stop = at
    while stop < len(envelope) and envelope[stop].isdigit():
        stop += 1
    route_at += len(_ROUTE)
    route = envelope[route_at : envelope.find('"', route_at)]
    if stop == at:
        return None
    return base64.b64decode(envelope[start:end]), int(envelope[at:stop]), route


def block_of(finished: Sequence[tuple[str, str | JobResult]]) -> VectorBlock:
    """One pass's (job id, envelope JSON or envelope) as a :class:`VectorBlock`: every job's
    rows as little-endian float32 bytes, made into one array at the end."""
    ids: list[str] = []
    rows: list[bytes] = []
    counts: list[int] = []
    tokens: list[int] = []
    routes: list[str] = []
    others: list[JobResult] = []
    for job_id, envelope in finished:
        fast = _one_vector(envelope) if isinstance(envelope, str) else None
        if fast is not None:
            rows.append(fast[0])
            counts.append(1)
            ids.append(job_id)
            tokens.append(fast[1])
            routes.append(fast[2])
            continue
        doc = json.loads(envelope) if isinstance(envelope, str) else envelope.model_dump(mode="json")
        if doc.get("status") != Status.succeeded.value or doc.get("kind") != "embed":
            others.append(read_result(envelope) if isinstance(envelope, str) else envelope)
            continue
        matrix = matrix_of(doc.get("body"))  # several inputs, or floats: parsed the slow way
        rows.append(matrix.astype("<f4", copy=False).tobytes())
        counts.append(len(matrix))
        ids.append(job_id)
        tokens.append(int(((doc.get("body") or {}).get("usage") or {}).get("prompt_tokens", 0)))
        routes.append(str(doc.get("route") or ""))
    total = sum(counts)
    vectors = (
        np.frombuffer(b"".join(rows), dtype="<f4").reshape(total, -1)
        if total
        else np.zeros((0, 0), dtype=np.float32)
    )
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return VectorBlock(ids, vectors, offsets, np.asarray(tokens, dtype=np.int64), routes, others)


class Arrays:
    """The array half of :class:`Client`'s reading (its ``_passes`` are the client's)."""

    _passes: Callable[[Sequence[str], float, str | None], AsyncIterator[list[tuple[str, str | JobResult]]]]

    async def iter_arrays(
        self, job_ids: Sequence[str], timeout: float = 300.0, *, tenant: str | None = None
    ) -> AsyncIterator[VectorBlock]:
        """Embedding results as they finish, one :class:`VectorBlock` per pass: the same jobs,
        waits and time-out as :meth:`iter_results`, without an envelope per job."""
        async for finished in self._passes(job_ids, timeout, tenant):
            yield block_of(finished)
