"""Result blocks: one backend batch's results for the jobs of one bulk chunk, as one stored value.

A chunk's jobs used to be finished one envelope each (a JSON text per job, its vector in base64).
On a GPU-like model that made the worker, Redis and the reader spend more per item than the
model. Now a worker that runs a chunk as columns (``workers/blocks/``) writes what each backend
batch gave the chunk as one *block*: the rows' indices, token counts and the float32 matrix of
their vectors, in a field ``b<k>`` of the chunk's record. Envelopes exist only where a caller
asks for one (:meth:`ResultBlock.envelope`); an array reader takes the rows as they are.

Which jobs are terminal, and where each result is, is one field ``x`` of the chunk's record: a
``uint16`` per job, little-endian (and each job's attempts one field ``y``, a byte per job). 0: not terminal; :data:`IN_ENVELOPE`: its envelope is field
``r<i>`` (a failure, a cancel, a job run on the item path); any other k: row of block ``b<k>``.
The scripts that finish, cancel and start jobs of a chunk test and set it, so each job is
written once whichever path finishes it.

A block is bytes: :data:`MAGIC`, a ``uint32`` header length, the header (JSON: the fields every
row shares), then a ``uint32`` row count, ``int32`` indices, ``int32`` token counts and the ``float32 [rows, d]`` matrix.
No pickle: any reader in any language can take it apart.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .envelope import JobResult, Timings, trusted
from .kinds import JobKind, Route, Status

MAGIC = b"OSB1"
IN_ENVELOPE = 0xFFFF  # location of a job whose result is an envelope field r<i>
OWN_METADATA_FIELD = "mo"  # set on a chunk's record when some of its jobs have metadata of their own
_HEAD = struct.Struct("<4sI")
_ROWS = struct.Struct("<I")


def block_field(number: int | str) -> str:
    return f"b{number}"


@dataclass(frozen=True, slots=True)
class BlockHead:
    """What every row of a block shares: where and how it ran, and when."""

    kind: str
    model: str
    route: str
    reason: str | None
    encoding: str  # what the callers asked for: "float" (vectors stored packed) or "base64"
    picked: float  # when the worker took the chunk (queued_ms counts to it)
    finished: float
    batch_ms: float
    infer_ms: float
    batch_size: int
    attempts: int

    def as_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class ChunkHead:
    """The fields of a chunk's record its envelopes need (shared by all its jobs)."""

    chunk_id: str
    kind: str
    tenant: str
    created_at: float
    metadata: dict[str, str]


def pack_block(head: BlockHead, indices: np.ndarray, tokens: np.ndarray, vectors: np.ndarray) -> bytes:
    """A block's stored bytes: ``indices[i]`` is the chunk index of row ``vectors[i]``."""
    header = head.as_json()
    rows = len(indices)
    if len(tokens) != rows or len(vectors) != rows:
        raise ValueError(f"a block needs as many tokens and vectors as indices ({rows})")
    return b"".join(
        (
            _HEAD.pack(MAGIC, len(header)),
            header,
            _ROWS.pack(rows),
            np.ascontiguousarray(indices, dtype="<i4").tobytes(),
            np.ascontiguousarray(tokens, dtype="<i4").tobytes(),
            np.ascontiguousarray(vectors, dtype="<f4").tobytes(),
        )
    )


@dataclass(slots=True)
class ResultBlock:
    """A stored block, taken apart without copying its matrix."""

    head: BlockHead
    indices: np.ndarray  # int32 [rows]
    tokens: np.ndarray  # int32 [rows]
    vectors: np.ndarray  # float32 [rows, d]
    _rows: dict[int, int] | None = None
    _shared: tuple[float, dict[str, Any], JobKind, Route] | None = None  # what every row's envelope shares

    @classmethod
    def unpack(cls, raw: bytes) -> ResultBlock:
        magic, size = _HEAD.unpack_from(raw)
        if magic != MAGIC:
            raise ValueError("not a result block")
        at = _HEAD.size + size
        head = BlockHead(**json.loads(raw[_HEAD.size : at]))
        (rows,) = _ROWS.unpack_from(raw, at)
        at += _ROWS.size
        indices = np.frombuffer(raw, dtype="<i4", count=rows, offset=at)
        tokens = np.frombuffer(raw, dtype="<i4", count=rows, offset=at + 4 * rows)
        values = np.frombuffer(raw, dtype="<f4", offset=at + 8 * rows)
        return cls(head, indices, tokens, values.reshape(rows, -1) if rows else values.reshape(0, 0))

    def row_of(self, index: int) -> int:
        """The row holding chunk index ``index`` (KeyError if it has none)."""
        if self._rows is None:
            self._rows = {int(i): r for r, i in enumerate(self.indices.tolist())}
        return self._rows[index]

    def envelope(self, row: int, chunk: ChunkHead, metadata: dict[str, str] | None = None) -> JobResult:
        """Row ``row`` as the envelope a job run one by one would have: in floats if its caller
        asked for floats (``packed_vectors`` is not set: it is unpacked already)."""
        head = self.head
        created, timings, kind, route = self._shared_for(chunk.created_at)
        tokens = int(self.tokens[row])
        vector = self.vectors[row]
        if head.encoding == "base64":
            embedding: Any = base64.b64encode(vector.tobytes()).decode()
        else:
            embedding = vector.tolist()
        body = {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": embedding}],
            "model": head.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return trusted(
            JobResult,
            {
                "id": f"{chunk.chunk_id}.{int(self.indices[row])}",
                "kind": kind,
                "status": Status.succeeded,
                "tenant": chunk.tenant,
                "route": route,
                "route_reason": head.reason,
                "model": head.model,
                "body": body,
                "error": None,
                "timings": trusted(Timings, dict(timings)),
                "attempts": head.attempts,
                "created_at": created,
                "finished_at": head.finished,
                "metadata": chunk.metadata if metadata is None else metadata,
                "packed_vectors": None,
            },
        )

    def _shared_for(self, created: float) -> tuple[float, dict[str, Any], JobKind, Route]:
        if self._shared is None or self._shared[0] != created:
            head = self.head
            timings = {
                "queued_ms": round((head.picked - created) * 1000, 3),
                "batch_ms": head.batch_ms,
                "infer_ms": head.infer_ms,
                "batch_size": head.batch_size,
                "total_ms": round((head.finished - created) * 1000, 3),
            }
            self._shared = (created, timings, JobKind(head.kind), Route(head.route))
        return self._shared


def locations(x: bytes | str | None, n: int) -> np.ndarray:
    """Field ``x`` as a ``uint16`` per job (all 0 where the field is missing or short)."""
    out = np.zeros(n, dtype=np.uint16)
    if x:
        raw = raw_bytes(x)
        got = np.frombuffer(raw, dtype="<u2", count=min(len(raw) // 2, n))
        out[: len(got)] = got
    return out


def attempts_map(y: bytes | str | None, n: int) -> np.ndarray:
    """Field ``y`` as a ``uint8`` per job: its attempts so far (0: never started)."""
    out = np.zeros(n, dtype=np.uint8)
    if y:
        raw = raw_bytes(y)[:n]
        out[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return out


def raw_bytes(value: bytes | str) -> bytes:
    """A binary value as read: a client that decodes responses hands it over as text decoded
    with ``surrogateescape`` (``contract/redis.py``), which gives the same bytes back."""
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
