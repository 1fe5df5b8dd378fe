"""Run a bulk chunk as a block: one routing decision, its texts in the batcher as columns, each
backend batch's rows written as one value (``producer/contract/blocks.py``).

A chunk runs here on its first run when its jobs are single texts for one local model and the
router keeps it local; the item path (``workers/jobs/task.py``) runs everything else, and what a
block hands back: rows whose backend was unavailable (re-queued with backoff: the item path
fails them over), the rest of a chunk that ran out of time (re-queued as a crash: the item path
splits it to isolate what crashed). A row the model rejects fails alone, with its envelope.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from producer.contract import (
    BlockHead,
    ErrorInfo,
    ErrorType,
    JobKind,
    JobResult,
    Lane,
    Route,
    RouteReason,
    Status,
    get_logger,
    pack_block,
)

from ..backends.base import EmbedColumns
from ..backends.local.batcher import MicroBatcher
from ..backends.local.handlers import ESTIMATED_TOKENS, LocalHandlers
from ..backends.local.tickets import Outcome
from ..core.errors import BackendUnavailable, ModelError
from ..core.metrics import PACKAGES
from ..core.progress import PackageClock, within
from ..core.settings import ModelSpec, WorkerConfig
from ..dispatch.dispatcher import Dispatcher
from ..queue.admission import Admission
from .columns import ChunkColumns, decode_columns
from .store import BlockStore
from .writer import BlockWriter

log = get_logger(__name__)


class BlockRunner:
    def __init__(
        self,
        config: WorkerConfig,
        store: BlockStore,
        local: LocalHandlers,
        dispatch: Dispatcher,
        admission: dict[Lane, Admission],
    ) -> None:
        self.config = config
        self.store = store
        self.local = local
        self.dispatch = dispatch
        self.admission = admission

    def plan(self, payload: dict[str, Any]) -> tuple[ChunkColumns, ModelSpec, RouteReason] | None:
        """The chunk's columns, model and routing reason if it runs as a block now, else None."""
        cols = decode_columns(payload, self.config.limits)
        if cols is None or self.dispatch.cache is not None:
            return None
        spec = self.config.model_for(JobKind.embed, cols.model)
        if spec is None or spec.remote_only or spec.name not in self.local.batchers:
            return None
        try:
            sample = cols.sample()
        except ValueError:  # its header does not parse: the item path fails its jobs
            return None
        now = time.time()
        if sample.deadline_at < now or self.dispatch.decider.shed(sample, spec, now) is not None:
            return None
        route, reason = self.dispatch.decider.decide(sample, spec)
        return (cols, spec, reason) if route == Route.local else None

    async def run(
        self, planned: tuple[ChunkColumns, ModelSpec, RouteReason], package_id: str, clock: PackageClock
    ) -> dict[str, int]:
        cols, spec, reason = planned
        lane = Lane(cols.header.get("lane", Lane.bulk.value))
        admission = self.admission[lane]
        admission.started(package_id, len(cols))
        flags, first = await self.store.start_block(cols.chunk_id, cols.indices)
        live = [p for p, f in enumerate(flags) if f > 0]
        attempts = max((flags[p] for p in live), default=1)
        if live and not first:  # the chunk used up its block numbers: the item path runs these
            await self.store.requeue(cols.items({cols.indices[p] for p in live}), lane, retries=1)
            admission.finished(package_id, 0)
            return {"items": len(cols), "handed_on": len(live)}
        writer = BlockWriter(
            self.store,
            cols.chunk_id,
            lane.value,
            spec.name,
            first,
            lambda n: admission.progress(package_id, n),
        )
        run = _Run(cols, spec, reason, writer, attempts, self.dispatch)
        batcher: MicroBatcher[Any] = self.local.batchers[spec.name]
        texts, costs, order = run.ordered(live, batcher)
        token = self.dispatch.load.begin(spec.name, len(live), lane)
        try:
            await within(
                clock, batcher.submit_rows(texts, costs, run.on_rows(order), 1, cols.header.get("tenant", ""))
            )
        except TimeoutError:
            await self._requeue(cols, writer, run, lane, crashes=1)
            PACKAGES.labels(lane.value, "timeout").inc()
            admission.finished(package_id, len(writer.handed))
            return {"timed_out": len(live) - len(writer.handed), "finished": len(writer.handed)}
        finally:
            self.dispatch.load.end(spec.name, token, done=len(run.unavailable) < len(live))
        if run.unavailable:
            self.dispatch.decider.triton_circuit.record_failure()
            await self._requeue(cols, writer, run, lane, retries=1)
        else:
            self.dispatch.decider.triton_circuit.record_success()
        await writer.drain()
        admission.finished(package_id, len(writer.handed))
        PACKAGES.labels(lane.value, "done").inc()
        (log.warning if writer.failed else log.debug)(
            "block done", rows=len(cols), ran=len(live), written=writer.written, failed=writer.failed
        )
        return {"items": len(cols), "finished": len(writer.handed)}

    async def _requeue(
        self,
        cols: ChunkColumns,
        writer: BlockWriter,
        run: _Run,
        lane: Lane,
        *,
        crashes: int = 0,
        retries: int = 0,
    ) -> None:
        """The rows not handed over go back as a package of the item path."""
        await writer.drain()
        rest = set(run.started) - writer.handed
        if not rest:
            return
        items = cols.items(rest)
        if retries:
            delay = min(self.config.retry_backoff_s, self.config.retry_backoff_max_s)
            await self.store.requeue(items, lane, defer_s=delay, retries=retries)
            log.warning("backend unavailable, block rows wait", items=len(items), retry_in_s=delay)
        else:
            await self.store.requeue(items, lane, parts=min(2, len(items)), crashes=crashes)
            log.warning("block timed out, re-queued", items=len(items), kept=len(writer.handed))


class _Run:
    """One block's run: turns each backend batch's rows into a stored block."""

    def __init__(
        self,
        cols: ChunkColumns,
        spec: ModelSpec,
        reason: RouteReason,
        writer: BlockWriter,
        attempts: int,
        dispatch: Dispatcher,
    ) -> None:
        self.cols = cols
        self.spec = spec
        self.reason = reason
        self.writer = writer
        self.attempts = attempts
        self.ledger = dispatch.ledger
        self.picked = time.time()
        self.created = float(cols.header.get("created_at", self.picked))
        self.started: list[int] = []
        self.unavailable: list[int] = []

    def ordered(
        self, live: list[int], batcher: MicroBatcher[Any]
    ) -> tuple[list[str], list[int] | None, list[int]]:
        """The live rows' texts, shortest first where the batcher weighs tokens (requests of
        similar length), their costs, and each one's chunk index."""
        cols = self.cols
        self.started = [cols.indices[p] for p in live]
        estimate = ESTIMATED_TOKENS[JobKind.embed] if batcher.max_batch_tokens else None
        if estimate is None:
            return [cols.texts[p] for p in live], None, self.started
        costs = [estimate(cols.texts[p]) for p in live]
        by_cost = sorted(range(len(live)), key=costs.__getitem__)
        return (
            [cols.texts[live[j]] for j in by_cost],
            [costs[j] for j in by_cost],
            [self.started[j] for j in by_cost],
        )

    def on_rows(self, order: list[int]) -> Any:
        def settle(result: Any, positions: list[int], rows: list[int], outcome: Outcome) -> None:
            self.settle(result, [order[p] for p in positions], rows, outcome)

        return settle

    def settle(self, result: Any, indices: list[int], rows: list[int], outcome: Outcome) -> None:
        """One backend request's rows for this block: stored as one block, failures alone."""
        if isinstance(result, EmbedColumns):
            errors = [result.errors[r] for r in rows]
            ok = [j for j, e in enumerate(errors) if not e]
            vectors, tokens = result.vectors[[rows[j] for j in ok]], result.tokens[[rows[j] for j in ok]]
            failed = [(indices[j], ModelError(errors[j])) for j, e in enumerate(errors) if e]
        else:  # the request failed as a whole (an exception per row), or a backend of items
            ok, failed, values = [], [], []
            for j, r in enumerate(rows):
                value = result[r]
                if isinstance(value, tuple):
                    ok.append(j)
                    values.append(value)
                elif isinstance(value, BackendUnavailable):
                    self.unavailable.append(indices[j])
                else:
                    failed.append((indices[j], value))
            vectors = np.stack([np.asarray(v, dtype=np.float32) for v, _ in values]) if values else None
            tokens = np.asarray([t for _, t in values], dtype=np.int32)
        if failed:
            self.writer.add_failed([self._failure(i, e) for i, e in failed], [i for i, _ in failed])
        if ok and vectors is not None:
            self._store(np.asarray([indices[j] for j in ok], dtype=np.int32), tokens, vectors, outcome)

    def _store(self, indices: np.ndarray, tokens: np.ndarray, vectors: np.ndarray, outcome: Outcome) -> None:
        finished = time.time()
        head = BlockHead(
            JobKind.embed.value,
            self.spec.name,
            Route.local.value,
            self.reason.value if self.reason else None,
            self.cols.encoding,
            self.picked,
            finished,
            outcome.wait_ms,
            outcome.infer_ms,
            outcome.batch_size,
            self.attempts,
        )
        blob = pack_block(head, indices, tokens, vectors)
        queued_ms = (self.picked - self.created) * 1000
        total_ms = (finished - self.created) * 1000
        self.writer.add_block(blob, indices.tolist(), queued_ms, total_ms, outcome.wait_ms)
        rows = len(indices)
        gpu_s = outcome.infer_ms / 1000 * rows / max(outcome.batch_size, 1)
        tenant = str(self.cols.header.get("tenant", ""))
        self.ledger.record_rows(tenant, self.spec.name, rows, int(tokens.sum()), gpu_s, self.reason)

    def _failure(self, index: int, error: Any) -> JobResult:
        """A row's own failed envelope (the model rejected it)."""
        kind = getattr(error, "type", ErrorType.internal_error)
        message = getattr(error, "message", None) or str(error)
        now = time.time()
        return JobResult(
            id=f"{self.cols.chunk_id}.{index}",
            kind=JobKind.embed,
            status=Status.failed,
            tenant=str(self.cols.header.get("tenant", "default")),
            route=Route.local,
            model=self.spec.name,
            error=ErrorInfo(type=kind, message=message),
            attempts=self.attempts,
            created_at=self.created,
            finished_at=now,
            metadata=self._metadata(index),
        )

    def _metadata(self, index: int) -> dict[str, str]:
        own = next((e[2] for e in self.cols.entries if e[0] == index and len(e) == 3), None)
        return own if isinstance(own, dict) else self.cols.header.get("metadata") or {}
