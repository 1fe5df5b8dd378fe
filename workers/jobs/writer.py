"""ResultWriter: a package's results go to Redis as they come back, not when the package ends.

Each backend batch that returns settles its jobs in one event-loop tick; the writer collects
what settled in that tick and writes it in one script call (then queues its webhooks and counts
its metrics). So the work done before a time-out, a crash or a kill is kept: a re-run of the
package finds those jobs terminal and skips them instead of computing them again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from producer.contract import JobResult, Status, WorkItem, get_logger

from ..core.metrics import count_results
from ..delivery.webhooks import Webhooks
from .store import JobStore

log = get_logger(__name__)


class Outcomes(list[Any]):
    """A package's per-job outcome slots; the first value put in a slot goes to ``on_set``."""

    def __init__(self, n: int, on_set: Callable[[int, Any], None]) -> None:
        super().__init__([None] * n)
        self._on_set = on_set

    def __setitem__(self, index: Any, value: Any) -> None:
        first = list.__getitem__(self, index) is None
        super().__setitem__(index, value)
        if first and value is not None:
            self._on_set(index, value)


class ResultWriter:
    """Writes one package's results a tick at a time; :meth:`drain` waits for the last write."""

    def __init__(
        self,
        store: JobStore,
        webhooks: Webhooks,
        items: Sequence[WorkItem],
        lane: str,
        on_handed: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._on_handed = on_handed  # told how many results each tick hands over (admission's rate)
        self._webhooks = webhooks
        self._items = {i.id: i for i in items}
        self._lane = lane
        self._pending: list[JobResult] = []
        self._flusher: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self.handed: set[str] = set()  # jobs whose result was handed over (written or being written)
        self.failed = 0

    def add(self, results: Sequence[JobResult]) -> None:
        if not results:
            return
        self._pending.extend(results)
        self.handed.update(r.id for r in results)
        if self._on_handed is not None:
            self._on_handed(len(results))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name="results")

    async def drain(self) -> None:
        """Wait until everything handed over is written; re-raise a write's error (Redis)."""
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
        if self._error is not None:
            raise self._error

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)  # the rest of the same batch settles in this tick
            while self._pending and self._error is None:
                batch, self._pending = self._pending, []
                await self._write(batch)
        except Exception as exc:  # Redis unreachable: the package's run re-raises it
            self._error = exc
        finally:
            self._flusher = None

    async def _write(self, results: list[JobResult]) -> None:
        written = await self._store.finish(results)
        await self._webhooks.enqueue([self._items[r.id] for r in results], results, written)
        self.failed += sum(r.status != Status.succeeded for r in results)
        count_results(results, self._lane)
