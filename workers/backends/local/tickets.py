"""What waits in a MicroBatcher: items (:class:`Pending`), the submissions they belong to
(:class:`Ticket`, one future for all of a submission's items; :class:`RowsTicket` for a block,
settled a backend request at a time) and what each item gets back (:class:`Outcome`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import WorkerError
from ...core.progress import CURRENT, PackageClock


@dataclass(slots=True)
class Outcome:
    """What one item got back, with the batch that carried it."""

    value: Any = None
    error: WorkerError | None = None
    batch_size: int = 0
    wait_ms: float = 0.0
    infer_ms: float = 0.0
    batch_id: str = ""


class Ticket:
    """One ``submit_many`` call: a single future for all its items (not one per item)."""

    __slots__ = ("future", "outcomes", "left", "clock")

    def __init__(self, future: asyncio.Future[list[Outcome]], n: int) -> None:
        self.future = future
        self.outcomes: list[Outcome | None] = [None] * n
        self.left = n
        self.clock: PackageClock | None = CURRENT.get()  # the submitting package's time limit

    def settle(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(self.outcomes)  # type: ignore[arg-type]


# Told, per backend request, what a block submission got: the request's whole result, this
# submission's item indices and their rows in the request, and its Outcome timings.
RowsHook = Callable[[Any, list[int], list[int], "Outcome"], None]


class RowsTicket(Ticket):
    """A block submission (:meth:`MicroBatcher.submit_rows`): settled a request at a time with
    the request's own result (arrays), not an Outcome per item."""

    __slots__ = ("on_rows",)

    def __init__(self, future: asyncio.Future[list[Outcome]], n: int, on_rows: RowsHook) -> None:
        super().__init__(future, n)
        self.on_rows = on_rows

    def settle_rows(self, result: Any, indices: list[int], rows: list[int], outcome: Outcome) -> None:
        self.left -= len(indices)
        try:
            self.on_rows(result, indices, rows, outcome)
        except Exception as exc:  # the block's own bug: its submission fails, not the batch
            if not self.future.done():
                self.future.set_exception(exc)
            return
        if self.left == 0 and not self.future.done():
            self.future.set_result([])


@dataclass(slots=True)
class Pending:
    item: Any
    ticket: Ticket
    index: int
    enqueued: float = field(default_factory=time.monotonic)
    cost: int = 0  # estimated tokens, where the batcher is token-aware
    owner: str = ""  # the job the item belongs to (a cancelled job's items leave the queue)
    group: str = ""  # its tenant: each tenant's items wait in a line of their own (lines.py)

    def abandoned(self) -> bool:
        return self.ticket.future.done()
