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

from ..contract import BlockRow, JobResult, Status, matrix_of, read_result


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


def block_of(finished: Sequence[tuple[str, str | JobResult | BlockRow]]) -> VectorBlock:
    """One pass's (job id, envelope JSON, envelope or block row) as a :class:`VectorBlock`.

    Rows of result blocks are copied block by block into the matrix (one fancy index per
    block); a stored envelope's vector is decoded from its base64 bytes."""
    ids: list[str] = []
    pieces: list[np.ndarray | None] = []  # per job: its rows, or None for a block row (below)
    counts: list[int] = []
    tokens: list[int] = []
    routes: list[str] = []
    others: list[JobResult] = []
    from_blocks: dict[int, tuple[BlockRow, list[int], list[int]]] = {}  # block → rows, jobs
    for job_id, found in finished:
        if isinstance(found, BlockRow) and found.block.head.kind != "embed":
            others.append(found.envelope())  # a rerank or chat result: no vector to give
            continue
        if isinstance(found, BlockRow):
            entry = from_blocks.setdefault(id(found.block), (found, [], []))
            entry[1].append(found.row)
            entry[2].append(len(ids))
            pieces.append(None)
            counts.append(1)
            ids.append(job_id)
            tokens.append(int(found.block.tokens[found.row]))
            routes.append(found.block.head.route)
            continue
        fast = _one_vector(found) if isinstance(found, str) else None
        if fast is not None:
            pieces.append(np.frombuffer(fast[0], dtype="<f4").reshape(1, -1))
            counts.append(1)
            ids.append(job_id)
            tokens.append(fast[1])
            routes.append(fast[2])
            continue
        doc = json.loads(found) if isinstance(found, str) else found.model_dump(mode="json")
        if doc.get("status") != Status.succeeded.value or doc.get("kind") != "embed":
            others.append(read_result(found) if isinstance(found, str) else found)
            continue
        matrix = matrix_of(doc.get("body"))  # several inputs, or floats: parsed the slow way
        pieces.append(matrix.astype("<f4", copy=False))
        counts.append(len(matrix))
        ids.append(job_id)
        tokens.append(int(((doc.get("body") or {}).get("usage") or {}).get("prompt_tokens", 0)))
        routes.append(str(doc.get("route") or ""))
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    vectors = _matrix(pieces, offsets, from_blocks)
    return VectorBlock(ids, vectors, offsets, np.asarray(tokens, dtype=np.int64), routes, others)


def _matrix(
    pieces: list[np.ndarray | None],
    offsets: np.ndarray,
    from_blocks: dict[int, tuple[BlockRow, list[int], list[int]]],
) -> np.ndarray:
    total = int(offsets[-1])
    if not total:
        return np.zeros((0, 0), dtype=np.float32)
    width = _width(pieces, from_blocks)
    out = np.empty((total, width), dtype=np.float32)
    for found, rows, jobs in from_blocks.values():
        out[offsets[jobs]] = found.block.vectors[rows]
    for position, piece in enumerate(pieces):
        if piece is not None:
            out[offsets[position] : offsets[position + 1]] = piece
    return out


def _width(
    pieces: list[np.ndarray | None], from_blocks: dict[int, tuple[BlockRow, list[int], list[int]]]
) -> int:
    """The vectors' dimension: any block's, or any decoded piece's."""
    for found, _, _ in from_blocks.values():
        return int(found.block.vectors.shape[1])
    return next((int(p.shape[1]) for p in pieces if p is not None and p.ndim == 2), 0)


class Arrays:
    """The array half of :class:`Client`'s reading (its ``_passes`` are the client's)."""

    _passes: Callable[
        [Sequence[str], float, str | None], AsyncIterator[list[tuple[str, str | JobResult | BlockRow]]]
    ]

    async def iter_arrays(
        self, job_ids: Sequence[str], timeout: float = 300.0, *, tenant: str | None = None
    ) -> AsyncIterator[VectorBlock]:
        """Embedding results as they finish, one :class:`VectorBlock` per pass: the same jobs,
        waits and time-out as :meth:`iter_results`, without an envelope per job."""
        async for finished in self._passes(job_ids, timeout, tenant):
            yield block_of(finished)
