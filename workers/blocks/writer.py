"""BlockWriter: a block's results go to Redis a backend batch at a time, one value per batch.

What the requests that returned in one event-loop tick gave a chunk is written together: its
blocks (each batch's jobs' outputs, indices and token counts as one value) in one ``HSET`` and
one ``block_write.lua`` call, and, for rows that failed, their envelopes in one
``chunk_finish.lua`` call. Metrics and
the usage ledger count per batch, not per job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from producer.contract import JobResult, get_logger

from ..core.flusher import TickFlusher
from ..core.metrics import BATCH_WAIT_MS, JOBS, QUEUE_MS, TOTAL_MS, count_results, observe_many
from .store import BlockStore

log = get_logger(__name__)


@dataclass(slots=True)
class _Block:
    number: int
    blob: bytes
    indices: list[int]
    queued_ms: float  # what its rows' envelopes say (the histograms see each row once)
    total_ms: float
    wait_ms: float


@dataclass(slots=True)
class _Pending:
    blocks: list[_Block] = field(default_factory=list)
    failed: list[JobResult] = field(default_factory=list)


class BlockWriter(TickFlusher[_Pending]):
    """Writes one chunk's blocks as they come; :meth:`drain` waits for the last write."""

    def __init__(
        self,
        store: BlockStore,
        chunk_id: str,
        lane: str,
        kind: str,
        model: str,
        first: int,
        on_handed: Callable[[int], None],
    ) -> None:
        super().__init__("blocks")
        self._store = store
        self._model = model
        self._next = first  # the next block number (block_start.lua reserved one per row)
        self._chunk_id = chunk_id
        self._lane = lane
        self._kind = kind
        self._on_handed = on_handed  # admission's rate: results per batch
        self._pending = _Pending()
        self.handed: set[int] = set()  # chunk indices whose result was handed over
        self.written = 0
        self.failed = 0

    def add_block(
        self, blob: bytes, indices: list[int], queued_ms: float, total_ms: float, wait_ms: float
    ) -> None:
        self._pending.blocks.append(_Block(self._next, blob, indices, queued_ms, total_ms, wait_ms))
        self._next += 1
        self._handed(indices)

    def add_failed(self, results: list[JobResult], indices: list[int]) -> None:
        self._pending.failed.extend(results)
        self._handed(indices)

    def _handed(self, indices: list[int]) -> None:
        self.handed.update(indices)
        self._on_handed(len(indices))
        self._schedule()

    def _take(self) -> _Pending | None:
        batch, self._pending = self._pending, _Pending()
        return batch if batch.blocks or batch.failed else None

    async def _write(self, batch: _Pending) -> None:
        if batch.blocks:
            flags = await self._store.write_blocks(
                self._chunk_id, [(b.number, b.blob, b.indices) for b in batch.blocks]
            )
            self._count(batch.blocks, flags)
        if batch.failed:
            await self._store.finish(batch.failed)
            self.failed += len(batch.failed)
            count_results(batch.failed, self._lane)

    def _count(self, blocks: list[_Block], flags: list[list[int]]) -> None:
        written = 0
        for block, per_row in zip(blocks, flags, strict=True):
            n = sum(f == 1 for f in per_row)
            if any(f < 0 for f in per_row):
                log.error(
                    "block rows not written",
                    chunk_id=self._chunk_id,
                    rows=len(block.indices),
                    flags=min(per_row),
                )
            written += n
            observe_many(QUEUE_MS.labels(self._lane), [block.queued_ms] * n)
            observe_many(TOTAL_MS.labels(self._kind), [block.total_ms] * n)
            observe_many(BATCH_WAIT_MS.labels(self._model), [block.wait_ms] * n)
        if written:
            JOBS.labels(self._kind, "local", "succeeded").inc(written)
        self.written += written
