"""ResultWriter: a package's results go to Redis as they come back, not when the package ends.

Each backend batch that returns settles its jobs in one event-loop tick; the writer collects
what settled in that tick and writes it in one script call (then queues its webhooks and counts
its metrics). So the work done before a time-out, a crash or a kill is kept: a re-run of the
package finds those jobs terminal and skips them instead of computing them again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from producer.contract import JobResult, Status, WorkItem, get_logger

from ..core.flusher import TickFlusher
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


class ResultWriter(TickFlusher[list[JobResult]]):
    """Writes one package's results a tick at a time; :meth:`drain` waits for the last write."""

    def __init__(
        self,
        store: JobStore,
        webhooks: Webhooks,
        items: Sequence[WorkItem],
        lane: str,
        on_handed: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__("results")
        self._store = store
        self._on_handed = on_handed  # told how many results each tick hands over (admission's rate)
        self._webhooks = webhooks
        self._items = {i.id: i for i in items}
        self._lane = lane
        self._pending: list[JobResult] = []
        self.handed: set[str] = set()  # jobs whose result was handed over (written or being written)
        self.failed = 0

    def add(self, results: Sequence[JobResult]) -> None:
        if not results:
            return
        self._pending.extend(results)
        self.handed.update(r.id for r in results)
        if self._on_handed is not None:
            self._on_handed(len(results))
        self._schedule()

    def _take(self) -> list[JobResult] | None:
        batch, self._pending = self._pending, []
        return batch or None

    async def _write(self, results: list[JobResult]) -> None:
        written = await self._store.finish(results)
        await self._webhooks.enqueue([self._items[r.id] for r in results], results, written)
        self.failed += sum(r.status != Status.succeeded for r in results)
        count_results(results, self._lane)
