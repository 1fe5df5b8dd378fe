"""Run a bulk chunk as a block: one routing decision, its inputs in the batcher as columns, each
backend batch's finished jobs written as one value (``producer/contract/blocks.py``).

A chunk runs here on its first run when a block carries what its jobs return (``columns.py``),
its model is local and the router keeps it local; the item path (``workers/jobs/task.py``) runs everything else, and what a
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
    lacking,
    pack_block,
)

from ..backends.local.batcher import MicroBatcher
from ..backends.local.handlers import LocalHandlers
from ..backends.local.tickets import Outcome
from ..core.errors import StreamCancelled
from ..core.metrics import PACKAGES
from ..core.progress import PackageClock, within
from ..core.settings import ModelSpec, WorkerConfig
from ..dispatch.dispatcher import Dispatcher
from ..queue.admission import Admission
from .columns import ChunkColumns, decode_columns
from .rows import BlockRows, ChatRows, RerankRows, Settled
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
        spec = self.config.model_for(cols.kind, cols.model)
        if spec is None or spec.remote_only or spec.name not in self.local.batchers:
            return None
        if cols.kind == JobKind.chat and any(lacking(e[1], spec.offers) for e in cols.entries):
            return None  # a job the local model cannot answer: capability routing is per job
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
            cols.kind.value,
            spec.name,
            first,
            lambda n: admission.progress(package_id, n),
        )
        rows = self._rows(cols, live)
        run = _Run(cols, spec, reason, writer, attempts, self.dispatch, rows)
        batcher: MicroBatcher[Any] = self.local.batchers[spec.name]
        items, costs = rows.items(bool(batcher.max_batch_tokens))
        token = self.dispatch.load.begin(spec.name, len(live), lane)
        if isinstance(rows, ChatRows) and self.local.cancels is not None:
            self.local.cancels.start()  # a cancelled job's conversation leaves the batcher unsent
        try:
            await within(
                clock, batcher.submit_rows(items, costs, run.settle, 1, cols.header.get("tenant", ""))
            )
        except TimeoutError:
            await self._requeue(cols, writer, run, lane, crashes=1)
            PACKAGES.labels(lane.value, "timeout").inc()
            admission.finished(package_id, len(writer.handed))
            return {"timed_out": len(live) - len(writer.handed), "finished": len(writer.handed)}
        finally:
            self.dispatch.load.end(spec.name, token, done=len(run.unavailable) < len(live))
            if isinstance(rows, ChatRows):
                rows.unwatch()
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

    def _rows(self, cols: ChunkColumns, live: list[int]) -> BlockRows:
        if cols.kind == JobKind.rerank:
            return RerankRows(cols, live)
        if cols.kind == JobKind.chat:
            return ChatRows(cols, live, self.config, self.local.cancels)
        return BlockRows(cols, live)

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
    """One block's run: turns what each backend request finished into a stored block."""

    def __init__(
        self,
        cols: ChunkColumns,
        spec: ModelSpec,
        reason: RouteReason,
        writer: BlockWriter,
        attempts: int,
        dispatch: Dispatcher,
        rows: BlockRows,
    ) -> None:
        self.cols = cols
        self.spec = spec
        self.reason = reason
        self.writer = writer
        self.attempts = attempts
        self.ledger = dispatch.ledger
        self.rows = rows
        self.picked = time.time()
        self.created = float(cols.header.get("created_at", self.picked))
        self.started = [cols.indices[p] for p in rows.live]
        self.unavailable: list[int] = []

    def settle(self, result: Any, positions: list[int], rows: list[int], outcome: Outcome) -> None:
        """One backend request's rows for this block: its finished jobs stored as one block,
        failures alone."""
        done = self.rows.settle(result, positions, rows)
        self.unavailable += done.unavailable
        if done.failed:
            self.writer.add_failed([self._failure(i, e) for i, e in done.failed], [i for i, _ in done.failed])
        if done.indices:
            self._store(done, outcome)

    def _store(self, done: Settled, outcome: Outcome) -> None:
        finished = time.time()
        head = BlockHead(
            self.cols.kind.value,
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
        indices = np.asarray(done.indices, dtype=np.int32)
        tokens = np.asarray(done.tokens, dtype=np.int32)
        blob = pack_block(head, indices, tokens, done.vectors, ranked=done.ranked, generated=done.generated)
        queued_ms = (self.picked - self.created) * 1000
        total_ms = (finished - self.created) * 1000
        self.writer.add_block(blob, done.indices, queued_ms, total_ms, outcome.wait_ms)
        gpu_s = outcome.infer_ms / 1000 * min(done.items, outcome.batch_size) / max(outcome.batch_size, 1)
        tenant = str(self.cols.header.get("tenant", ""))
        used = (int(tokens.sum()), done.completion)
        self.ledger.record_rows(tenant, self.spec.name, len(indices), done.items, used, gpu_s, self.reason)

    def _failure(self, index: int, error: Any) -> JobResult:
        """A job's own envelope: the model rejected it, or (chat) its job was cancelled."""
        kind = getattr(error, "type", ErrorType.internal_error)
        message = getattr(error, "message", None) or str(error)
        return JobResult(
            id=f"{self.cols.chunk_id}.{index}",
            kind=self.cols.kind,
            status=Status.cancelled if isinstance(error, StreamCancelled) else Status.failed,
            tenant=str(self.cols.header.get("tenant", "default")),
            route=Route.local,
            model=self.spec.name,
            error=ErrorInfo(type=kind, message=message),
            attempts=self.attempts,
            created_at=self.created,
            finished_at=time.time(),
            metadata=self._metadata(index),
        )

    def _metadata(self, index: int) -> dict[str, str]:
        own = next((e[2] for e in self.cols.entries if e[0] == index and len(e) == 3), None)
        return own if isinstance(own, dict) else self.cols.header.get("metadata") or {}
