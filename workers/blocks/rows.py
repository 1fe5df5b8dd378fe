"""What each kind puts in the batcher for a block, and what it makes of a request's rows.

Embeddings: a row is a job's text, and a request's rows are jobs done. Rerank: a job's
documents are rows (query, document) that may go out in several requests; a job is done when
its last row comes back, and is then ranked, best first, cut to its ``top_n``. Chat: a row is a
conversation (with the event its cancel sets). :meth:`settle` gives what one request finished:
the jobs for its block, the jobs that failed (each with the error an item-path run would give
it) and the jobs whose backend was unavailable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from producer.contract import Generated, JobKind, Ranked, chunk_item_id

from ..backends.base import ChatOutput, EmbedColumns
from ..backends.bodies import chat_params
from ..backends.local.handlers import ESTIMATED_TOKENS
from ..core.cancels import CancelWatch
from ..core.errors import BackendError, BackendUnavailable, ModelError
from ..core.settings import WorkerConfig
from .columns import ChunkColumns


@dataclass(slots=True)
class Settled:
    """What one backend request finished of a block: ``indices`` (chunk indices) are stored as
    one block, with their prompt ``tokens``, ``items`` inputs and their kind's output."""

    indices: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    items: int = 0
    completion: int = 0  # completion tokens between them (chat)
    vectors: np.ndarray | None = None
    ranked: Ranked | None = None
    generated: Generated | None = None
    failed: list[tuple[int, Exception]] = field(default_factory=list)
    unavailable: list[int] = field(default_factory=list)


class BlockRows:
    """Embeddings: one text a job."""

    def __init__(self, cols: ChunkColumns, live: list[int]) -> None:
        self.cols = cols
        self.live = live
        self.order: list[int] = []  # the chunk index of each row sent, in the order sent

    def items(self, weighs_tokens: bool) -> tuple[list[Any], list[int] | None]:
        """The rows to submit, shortest first where the batcher weighs tokens (requests of
        similar length), and their costs."""
        texts = [self.cols.texts[p] for p in self.live]
        indices = [self.cols.indices[p] for p in self.live]
        texts, costs, (self.order,) = _shortest_first(texts, self.cols.kind, weighs_tokens, indices)
        return texts, costs

    def settle(self, result: Any, positions: list[int], rows: list[int]) -> Settled:
        indices = [self.order[p] for p in positions]
        out = Settled()
        if isinstance(result, EmbedColumns):
            errors = [result.errors[r] for r in rows]
            ok = [j for j, e in enumerate(errors) if not e]
            out.vectors = result.vectors[[rows[j] for j in ok]]
            out.tokens = result.tokens[[rows[j] for j in ok]].tolist()
            out.failed = [(indices[j], ModelError(errors[j])) for j, e in enumerate(errors) if e]
        else:  # the request failed as a whole (an exception per row), or a backend of items
            ok, values = [], []
            for j, r in enumerate(rows):
                value = result[r]
                if isinstance(value, tuple):
                    ok.append(j)
                    values.append(value)
                else:
                    _failed(out, indices[j], value)
            out.vectors = np.stack([np.asarray(v, dtype=np.float32) for v, _ in values]) if values else None
            out.tokens = [int(t) for _, t in values]
        out.indices = [indices[j] for j in ok]
        out.items = len(ok)
        return out


class RerankRows(BlockRows):
    """Rerank: each (query, document) of a job is a row; the job is done with its last row."""

    def __init__(self, cols: ChunkColumns, live: list[int]) -> None:
        super().__init__(cols, live)
        self.owner: list[int] = []  # per row sent: the job (its position in live)
        self.doc: list[int] = []  # per row sent: its document's index in the job's request
        self.scores = [np.zeros(len(cols.requests[p].documents), np.float32) for p in live]
        self.tokens = [0] * len(live)
        self.left = [len(cols.requests[p].documents) for p in live]
        self.errors: list[list[tuple[int, Exception]]] = [[] for _ in live]

    def items(self, weighs_tokens: bool) -> tuple[list[Any], list[int] | None]:
        pairs, owner, doc = [], [], []
        for slot, p in enumerate(self.live):
            request = self.cols.requests[p]
            for d, text in enumerate(request.texts()):
                pairs.append((request.query, text))
                owner.append(slot)
                doc.append(d)
        pairs, costs, (self.owner, self.doc) = _shortest_first(
            pairs, self.cols.kind, weighs_tokens, owner, doc
        )
        return pairs, costs

    def settle(self, result: Any, positions: list[int], rows: list[int]) -> Settled:
        done: list[int] = []
        for position, r in zip(positions, rows, strict=True):
            slot, value = self.owner[position], result[r]
            if isinstance(value, tuple):
                self.scores[slot][self.doc[position]] = value[0]
                self.tokens[slot] += int(value[1])
            else:
                self.errors[slot].append((self.doc[position], value))
            self.left[slot] -= 1
            if not self.left[slot]:
                done.append(slot)
        out = Settled()
        offsets, docs, scores = [0], [], []
        for slot in done:
            index = self.cols.indices[self.live[slot]]
            if self.errors[slot]:  # as the item path: a backend's error first, then the first document's
                errors = sorted(self.errors[slot], key=lambda e: (not isinstance(e[1], BackendError), e[0]))
                _failed(out, index, errors[0][1])
                continue
            ranked = np.argsort(-self.scores[slot], kind="stable")  # best first; ties keep their order
            top_n = self.cols.requests[self.live[slot]].top_n
            ranked = ranked[:top_n] if top_n is not None else ranked
            out.indices.append(index)
            out.tokens.append(self.tokens[slot])
            out.items += len(self.scores[slot])
            docs.append(ranked)
            scores.append(self.scores[slot][ranked])
            offsets.append(offsets[-1] + len(ranked))
        if out.indices:
            out.ranked = Ranked(np.asarray(offsets), np.concatenate(docs), np.concatenate(scores))
        return out


class ChatRows(BlockRows):
    """Chat: a conversation a job, stopped early when its job is cancelled."""

    def __init__(
        self, cols: ChunkColumns, live: list[int], config: WorkerConfig, cancels: CancelWatch | None
    ) -> None:
        super().__init__(cols, live)
        self.config = config
        self.cancels = cancels
        self.watched: list[str] = []

    def items(self, weighs_tokens: bool) -> tuple[list[Any], list[int] | None]:
        rows = []
        self.order = [self.cols.indices[p] for p in self.live]
        for p, index in zip(self.live, self.order, strict=True):
            request = self.cols.requests[p]
            messages = json.dumps([{"role": m.prompt_role, "content": m.text} for m in request.messages])
            params = json.dumps(chat_params(request, self.config.limits))
            event = None
            if self.cancels is not None:
                self.watched.append(chunk_item_id(self.cols.chunk_id, index))
                event = self.cancels.watch(self.watched[-1])
            rows.append((messages, params, event))
        return rows, None

    def unwatch(self) -> None:
        for job_id in self.watched:
            self.cancels.unwatch(job_id)  # type: ignore[union-attr]  # watched only with a watch

    def settle(self, result: Any, positions: list[int], rows: list[int]) -> Settled:
        out = Settled()
        texts, finishes, completion = [], [], []
        for position, r in zip(positions, rows, strict=True):
            index, value = self.order[position], result[r]
            if not isinstance(value, ChatOutput):
                _failed(out, index, value)
                continue
            out.indices.append(index)
            out.tokens.append(value.prompt_tokens)
            texts.append(value.text)
            finishes.append(value.finish_reason)
            completion.append(value.completion_tokens)
        out.items = len(out.indices)
        out.completion = sum(completion)
        if out.indices:
            out.generated = Generated(np.asarray(completion), texts, finishes)
        return out


def _shortest_first(
    rows: list[Any], kind: JobKind, weighs_tokens: bool, *beside: list[int]
) -> tuple[list[Any], list[int] | None, tuple[list[int], ...]]:
    """``rows`` (and the lists ``beside`` them, in step) shortest first by the kind's token
    estimate, with their costs, where the batcher weighs tokens; else as they are, no costs."""
    if not weighs_tokens:
        return rows, None, beside
    costs = [ESTIMATED_TOKENS[kind](row) for row in rows]
    order = sorted(range(len(rows)), key=costs.__getitem__)
    return [rows[j] for j in order], [costs[j] for j in order], tuple([b[j] for j in order] for b in beside)


def _failed(out: Settled, index: int, error: Any) -> None:
    """A job's row came back as an error: unavailable backends try again later, the rest fail."""
    if isinstance(error, BackendUnavailable):
        out.unavailable.append(index)
    else:
        out.failed.append((index, error))
