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
row shares), then a ``uint32`` row count, ``int32`` indices, ``int32`` token counts (prompt tokens;
rerank's total), then what the rows' kind returns:

- embed: the ``float32 [rows, d]`` matrix;
- rerank: ``int32`` offsets ``[rows + 1]``, then each row's ranked document indices (``int32``)
  and their scores (``float32``), best first, already cut to the job's ``top_n``;
- chat: ``int32`` completion tokens, ``int32`` byte offsets ``[rows + 1]`` of the texts and of
  the finish reasons, then the UTF-8 texts and the finish reasons.

No pickle: any reader in any language can take it apart.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, fields
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
        # Its fields by name, not dataclasses.asdict (a deep copy: 2.5 % of a bulk worker's CPU).
        return json.dumps({f: getattr(self, f) for f in _HEAD_FIELDS}, separators=(",", ":")).encode()


_HEAD_FIELDS = tuple(f.name for f in fields(BlockHead))


@dataclass(frozen=True, slots=True)
class ChunkHead:
    """The fields of a chunk's record its envelopes need (shared by all its jobs)."""

    chunk_id: str
    kind: str
    tenant: str
    created_at: float
    metadata: dict[str, str]


@dataclass(slots=True)
class Ranked:
    """Rerank rows: row r's documents, best first, are ``docs[offsets[r]:offsets[r + 1]]``."""

    offsets: np.ndarray  # int32 [rows + 1]
    docs: np.ndarray  # int32: a document's index in its job's request
    scores: np.ndarray  # float32, beside docs


@dataclass(slots=True)
class Generated:
    """Chat rows: each one's text, finish reason and completion tokens."""

    completion: np.ndarray  # int32 [rows]
    texts: list[str]
    finishes: list[str]


def pack_block(
    head: BlockHead,
    indices: np.ndarray,
    tokens: np.ndarray,
    vectors: np.ndarray | None = None,
    *,
    ranked: Ranked | None = None,
    generated: Generated | None = None,
) -> bytes:
    """A block's stored bytes: ``indices[i]`` is the chunk index of row ``i``; the rows' output is
    ``vectors`` (embed), ``ranked`` (rerank) or ``generated`` (chat), as ``head.kind`` says."""
    header = head.as_json()
    rows = len(indices)
    if len(tokens) != rows:
        raise ValueError(f"a block needs as many token counts as indices ({rows})")
    parts = [
        _HEAD.pack(MAGIC, len(header)),
        header,
        _ROWS.pack(rows),
        _i32(indices),
        _i32(tokens),
    ]
    if head.kind == JobKind.rerank.value and ranked is not None and len(ranked.offsets) == rows + 1:
        parts += [
            _i32(ranked.offsets),
            _i32(ranked.docs),
            np.ascontiguousarray(ranked.scores, "<f4").tobytes(),
        ]
    elif head.kind == JobKind.chat.value and generated is not None and len(generated.texts) == rows:
        texts = [t.encode() for t in generated.texts]
        finishes = [f.encode() for f in generated.finishes]
        parts += [_i32(generated.completion), _i32(_ends(texts)), _i32(_ends(finishes)), *texts, *finishes]
    elif head.kind == JobKind.embed.value and vectors is not None and len(vectors) == rows:
        parts.append(np.ascontiguousarray(vectors, dtype="<f4").tobytes())
    else:
        raise ValueError(f"a {head.kind} block needs its kind's output for each of its {rows} rows")
    return b"".join(parts)


def _i32(values: Any) -> bytes:
    return np.ascontiguousarray(values, dtype="<i4").tobytes()


def _ends(values: list[bytes]) -> np.ndarray:
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in values], out=out[1:])
    return out


@dataclass(slots=True)
class ResultBlock:
    """A stored block, taken apart without copying its arrays."""

    head: BlockHead
    indices: np.ndarray  # int32 [rows]
    tokens: np.ndarray  # int32 [rows]
    vectors: np.ndarray  # float32 [rows, d] (embed; [0, 0] for the other kinds)
    ranked: Ranked | None = None
    generated: Generated | None = None
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
        at += 8 * rows
        empty = np.zeros((0, 0), dtype=np.float32)
        if head.kind == JobKind.rerank.value:
            offsets = np.frombuffer(raw, dtype="<i4", count=rows + 1, offset=at)
            total = int(offsets[-1])
            at += 4 * (rows + 1)
            docs = np.frombuffer(raw, dtype="<i4", count=total, offset=at)
            scores = np.frombuffer(raw, dtype="<f4", count=total, offset=at + 4 * total)
            return cls(head, indices, tokens, empty, ranked=Ranked(offsets, docs, scores))
        if head.kind == JobKind.chat.value:
            completion = np.frombuffer(raw, dtype="<i4", count=rows, offset=at)
            ends = np.frombuffer(raw, dtype="<i4", count=2 * (rows + 1), offset=at + 4 * rows).tolist()
            at += 4 * rows + 8 * (rows + 1)
            texts, finishes = ends[: rows + 1], ends[rows + 1 :]
            blob = raw[at:]
            base = texts[-1]
            return cls(
                head,
                indices,
                tokens,
                empty,
                generated=Generated(
                    completion,
                    [blob[texts[r] : texts[r + 1]].decode() for r in range(rows)],
                    [blob[base + finishes[r] : base + finishes[r + 1]].decode() for r in range(rows)],
                ),
            )
        values = np.frombuffer(raw, dtype="<f4", offset=at)
        return cls(head, indices, tokens, values.reshape(rows, -1) if rows else empty)

    def __len__(self) -> int:
        return len(self.indices)

    def row_of(self, index: int) -> int:
        """The row holding chunk index ``index`` (KeyError if it has none)."""
        if self._rows is None:
            self._rows = {int(i): r for r, i in enumerate(self.indices.tolist())}
        return self._rows[index]

    def envelope(self, row: int, chunk: ChunkHead, metadata: dict[str, str] | None = None) -> JobResult:
        """Row ``row`` as the envelope a job run one by one would have (an embedding in floats
        if its caller asked for floats: ``packed_vectors`` is not set, it is unpacked already)."""
        head = self.head
        created, timings, kind, route = self._shared_for(chunk.created_at)
        job_id = f"{chunk.chunk_id}.{int(self.indices[row])}"
        return trusted(
            JobResult,
            {
                "id": job_id,
                "kind": kind,
                "status": Status.succeeded,
                "tenant": chunk.tenant,
                "route": route,
                "route_reason": head.reason,
                "model": head.model,
                "body": self.body(row, job_id),
                "error": None,
                "timings": trusted(Timings, dict(timings)),
                "attempts": head.attempts,
                "created_at": created,
                "finished_at": head.finished,
                "metadata": chunk.metadata if metadata is None else metadata,
                "packed_vectors": None,
            },
        )

    def body(self, row: int, job_id: str) -> dict[str, Any]:
        """Row ``row``'s response body, the shape its kind's API returns."""
        tokens = int(self.tokens[row])
        model = self.head.model
        if self.ranked is not None:
            ranked = self.ranked
            lo, hi = int(ranked.offsets[row]), int(ranked.offsets[row + 1])
            results = [
                {"index": d, "relevance_score": s}
                for d, s in zip(ranked.docs[lo:hi].tolist(), ranked.scores[lo:hi].tolist(), strict=True)
            ]
            return {
                "id": job_id,
                "model": model,
                "results": results,
                "usage": {"total_tokens": tokens},
                "meta": {"billed_units": {"search_units": 1}},
            }
        if self.generated is not None:
            completion = int(self.generated.completion[row])
            return {
                "id": "chatcmpl-" + job_id.removeprefix("job_"),
                "object": "chat.completion",
                "created": int(self.head.finished),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self.generated.texts[row]},
                        "finish_reason": self.generated.finishes[row],
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": tokens,
                    "completion_tokens": completion,
                    "total_tokens": tokens + completion,
                },
            }
        vector = self.vectors[row]
        if self.head.encoding == "base64":
            embedding: Any = base64.b64encode(vector.tobytes()).decode()
        else:
            embedding = vector.tolist()
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": embedding}],
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

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
