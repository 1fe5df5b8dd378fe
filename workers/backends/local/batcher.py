"""MicroBatcher: coalesce items from many concurrent jobs into one backend request.

A loop flushes when ``max_batch`` items are pending, the oldest has waited ``max_wait_ms``,
or a request slot is free (``flush_when_free``): at most ``max_inflight`` requests are
outstanding, and while one is free a wait gains nothing, because Triton's dynamic batcher
merges the requests that queue behind a running execution. Once every slot is taken, items
accumulate, so batches grow by themselves under load and go out at once when it is light.
While the backend already has a full batch waiting behind the running one (``2 × max_batch``
items in flight), a partial batch is held until a request comes back or it fills: sent now it
would only queue, and Triton does not split requests, so a partial one that queues beside a
full one runs as an execution of its own (``python -m bench chaos`` measures the slowdown
goodput this holds up).
Models whose requests hold the backend long (chat) turn it off: there the window gathers
a fuller batch before the only slot is taken.
Interactive items (priority 0) are taken before bulk ones (priority 1); within a priority, each
tenant's items wait in a line of their own and the lines take turns, a request each (lines.py).

Token-aware (a ``cost`` per item, its estimated tokens): a transformer batch costs its padded
size, every row running to the longest, so each submission's items are queued shortest first
(a bulk chunk's 256 texts become requests of similar length), and a request stops at
``max_batch_tokens`` (rows × its longest row) as well as at ``max_batch`` rows: one long input
neither pads 63 short ones nor takes the backend's memory. With a ``lookahead``, a request is
the oldest waiting item and those nearest its length among the next ``lookahead`` (separate
interactive submissions, consecutive bulk chunks). Outcomes keep the input order.

A request that fails as a whole (:class:`InferenceFailed`) is split in halves and retried,
so one poisoned item fails alone instead of taking its batch-mates with it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from producer.contract import get_logger

from ...core.errors import InferenceFailed, StreamCancelled, WorkerError
from ...core.progress import LIVENESS, PackageClock
from .lines import Lines, fits, pick_similar
from .tickets import Outcome, Pending, RowsHook, RowsTicket, Ticket

log = get_logger(__name__)

T = TypeVar("T")

# The backend call: items in, one result (or ItemError) per item out, same order.
InferFn = Callable[[list[Any]], Awaitable[Sequence[Any]]]
BatchHook = Callable[[str, int, float], None]


class MicroBatcher(Generic[T]):
    def __init__(
        self,
        name: str,
        infer: InferFn,
        *,
        max_batch: int = 64,
        max_wait_ms: float = 2.0,
        max_inflight: int = 2,
        flush_when_free: bool = True,
        on_batch: BatchHook | None = None,
        cost: Callable[[Any], int] | None = None,
        max_batch_tokens: int | None = None,
        lookahead: int = 0,
    ) -> None:
        if max_batch < 1 or max_inflight < 1 or max_wait_ms < 0:
            raise ValueError("max_batch and max_inflight must be >= 1, max_wait_ms >= 0")
        self.name = name
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self._infer = infer
        self._on_batch = on_batch
        self._cost = cost
        self.max_batch_tokens = max_batch_tokens if cost is not None else None
        self.lookahead = lookahead if cost is not None else 0
        self._queues: tuple[Lines, Lines] = (Lines(), Lines())
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._batches = 0
        self._inflight = 0
        self._inflight_items = 0
        self.max_inflight = max_inflight
        self.flush_when_free = flush_when_free

    @property
    def backlog(self) -> int:
        """Items waiting for a batch (a routing signal)."""
        return len(self._queues[0]) + len(self._queues[1])

    def start(self) -> None:
        if self._loop_task is None:
            # A fresh context: the loop must not inherit the first caller's log fields (job_id).
            self._loop_task = asyncio.create_task(
                self._run(), name=f"batcher:{self.name}", context=contextvars.Context()
            )

    async def aclose(self) -> None:
        if self._loop_task:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for queue in self._queues:
            while queue:
                p = queue.popleft()
                if not p.abandoned():
                    p.ticket.future.cancel()

    async def submit_many(
        self, items: Sequence[T], priority: int = 0, owners: Sequence[str] | None = None, group: str = ""
    ) -> list[Outcome]:
        """Queue ``items`` together (they share batches where they fit) and await each outcome;
        ``owners`` names each item's job, for :meth:`drop`; ``group`` (the tenant) the line
        they wait in: lines take turns, a request each."""
        self.start()
        if not items:
            return []
        ticket = Ticket(asyncio.get_running_loop().create_future(), len(items))
        now = time.monotonic()
        queue = self._queues[1 if priority else 0]
        names = owners or [""] * len(items)
        if self._cost is None:
            queue.extend(Pending(item, ticket, i, now, 0, names[i], group) for i, item in enumerate(items))
        else:  # shortest first: consecutive items, and so requests, of similar length
            cost = self._cost
            pending = [
                Pending(item, ticket, i, now, cost(item), names[i], group) for i, item in enumerate(items)
            ]
            pending.sort(key=_by_cost)
            queue.extend(pending)
        self._wakeup.set()
        return await ticket.future

    async def submit_rows(
        self,
        items: Sequence[T],
        costs: Sequence[int] | None,
        on_rows: RowsHook,
        priority: int = 1,
        group: str = "",
    ) -> None:
        """Queue a block's ``items`` (already in the order they should go, e.g. shortest first,
        with their ``costs``): they wait, batch and split like any others, but each request
        that carries some of them calls ``on_rows`` once with its whole result. Returns when
        every item was handed over."""
        self.start()
        if not items:
            return
        ticket = RowsTicket(asyncio.get_running_loop().create_future(), len(items), on_rows)
        now = time.monotonic()
        price = costs or [0] * len(items)
        queue = self._queues[1 if priority else 0]
        queue.extend(Pending(item, ticket, i, now, price[i], "", group) for i, item in enumerate(items))
        self._wakeup.set()
        await ticket.future

    def waiting_owners(self) -> set[str]:
        """The jobs with items still waiting here (not yet sent to the backend)."""
        return {p.owner for queue in self._queues for p in queue if p.owner and not p.abandoned()}

    def drop_cancelled(self, owners: set[str]) -> int:
        """:meth:`drop` for jobs the producer cancelled: they end ``cancelled``."""
        return self.drop(owners, lambda: StreamCancelled("cancelled by the producer before it was sent out"))

    def drop(self, owners: set[str], error: Callable[[], WorkerError]) -> int:
        """Take the waiting items of ``owners`` out of the queues, each settled with ``error()``
        (a cancelled job's inputs never reach the backend); returns how many left."""
        dropped = 0
        for queue in self._queues:
            kept: list[Pending] = []
            for p in queue:
                if p.owner in owners:
                    if not p.abandoned():
                        p.ticket.settle(p.index, Outcome(None, error()))
                    dropped += 1
                else:
                    kept.append(p)
            if len(kept) != len(queue):
                queue.clear()
                queue.extend(kept)
        return dropped

    async def submit(self, item: T, priority: int = 0) -> Outcome:
        (outcome,) = await self.submit_many([item], priority)
        return outcome

    # ------------------------------------------------------------------ loop

    async def _run(self) -> None:
        while True:
            if not self.backlog:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self.backlog < self.max_batch and self._hold():
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), self._hold_s())
                except TimeoutError:
                    pass
                continue
            await self._slots.acquire()
            batch = self._take()
            self._inflight += 1
            self._inflight_items += len(batch)
            task = asyncio.create_task(self._execute(batch))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._finished, items=len(batch)))

    def _covered(self) -> bool:
        """The backend has a full batch queued behind the running one."""
        return self.flush_when_free and self._inflight_items >= 2 * self.max_batch

    def _hold(self) -> bool:
        """Whether a partial batch waits: the backend is covered, or no slot is free (or the
        model gathers by window) and the oldest item is still within it."""
        if self._covered():
            return True
        free = self.flush_when_free and self._inflight < self.max_inflight
        return not free and self._oldest() + self.max_wait_s > time.monotonic()

    def _hold_s(self) -> float | None:
        """How long a held batch may wait for a wake-up (a result, new items): while covered,
        until one comes; else until the oldest item's window ends."""
        if self._covered():
            return None
        return max(self._oldest() + self.max_wait_s - time.monotonic(), 0.0)

    def _oldest(self) -> float:
        return min(q[0].enqueued for q in self._queues if q)

    def _take(self) -> list[Pending]:
        batch: list[Pending] = []
        for queue in self._queues:
            if len(batch) >= self.max_batch:
                break
            if not batch and self.lookahead > 1 and len(queue) > 1:
                batch = self._take_similar(queue)
            else:
                self._take_in_order(queue, batch)
            queue.turn()
        _progress(batch)  # the time limits of these items' packages count from now
        return batch

    def _take_in_order(self, queue: Lines, batch: list[Pending]) -> None:
        budget = self.max_batch_tokens
        longest = max((p.cost for p in batch), default=0)
        while queue and len(batch) < self.max_batch:
            p = queue[0]
            if batch and not fits(len(batch) + 1, max(longest, p.cost), budget):
                return
            queue.popleft()
            if not p.abandoned():  # the job gave up (timeout, cancellation)
                batch.append(p)
                longest = max(longest, p.cost)

    def _take_similar(self, queue: Lines) -> list[Pending]:
        """The oldest item and those nearest its length among the next ``lookahead``: each
        request then holds texts of similar length however they arrived, and the oldest item
        always goes, so none waits behind later ones for long."""
        window: list[Pending] = []
        while queue and len(window) < self.lookahead:
            p = queue.popleft()
            if not p.abandoned():
                window.append(p)
        if not window:
            return []
        chosen = pick_similar([p.cost for p in window], self.max_batch, self.max_batch_tokens)
        taken = set(chosen)
        queue.extendleft(reversed([p for i, p in enumerate(window) if i not in taken]))
        return [window[i] for i in chosen]

    def _finished(self, task: asyncio.Task[None], items: int) -> None:
        self._tasks.discard(task)
        self._inflight -= 1
        self._inflight_items -= items
        self._slots.release()
        self._wakeup.set()  # a slot is free: what waits may go out now
        if not task.cancelled() and task.exception() is not None:
            log.error("batch task crashed", batcher=self.name, exc_info=task.exception())

    async def _execute(self, batch: list[Pending]) -> None:
        if not batch:
            return
        started = time.monotonic()
        try:
            results = await self._infer([p.item for p in batch])
            if len(results) != len(batch):
                raise InferenceFailed(f"backend returned {len(results)} results for {len(batch)} items")
        except InferenceFailed as exc:
            if len(batch) == 1:
                self._resolve(batch, [exc], started)
                return
            half = len(batch) // 2
            await asyncio.gather(self._execute(batch[:half]), self._execute(batch[half:]))
            return
        except WorkerError as exc:
            self._resolve(batch, [exc] * len(batch), started)
            return
        except Exception as exc:  # a bug in the backend adapter: fail these items, keep the loop
            err = WorkerError(f"{type(exc).__name__}: {exc}")
            self._resolve(batch, [err] * len(batch), started)
            return
        self._resolve(batch, results, started)  # as it came: a block takes the arrays whole

    def _resolve(self, batch: list[Pending], results: Sequence[Any], started: float) -> None:
        infer_ms = (time.monotonic() - started) * 1000
        self._batches += 1
        batch_id = f"{self.name}-{self._batches}"
        failed = _failures(results)
        log.debug("batch", batch_id=batch_id, size=len(batch), infer_ms=round(infer_ms, 2), failed=failed)
        if self._on_batch:
            self._on_batch(self.name, len(batch), infer_ms)
        if not all(p.abandoned() for p in batch):  # a batch no one waits for is no sign of life
            LIVENESS.batch_done()
        _progress(batch)
        size = len(batch)
        blocks: dict[RowsTicket, tuple[list[int], list[int], float]] = {}
        for row, p in enumerate(batch):  # a block's rows are not read one by one here
            if p.abandoned():
                continue
            wait_ms = (started - p.enqueued) * 1000
            if type(p.ticket) is RowsTicket:
                entry = blocks.get(p.ticket)
                if entry is None:
                    entry = blocks[p.ticket] = ([], [], wait_ms)
                entry[0].append(p.index)
                entry[1].append(row)
                continue
            result = results[row]
            if isinstance(result, WorkerError):
                outcome = Outcome(None, result, size, wait_ms, infer_ms, batch_id)
            else:
                outcome = Outcome(result, None, size, wait_ms, infer_ms, batch_id)
            p.ticket.settle(p.index, outcome)
        for ticket, (indices, rows, wait_ms) in blocks.items():
            ticket.settle_rows(results, indices, rows, Outcome(None, None, size, wait_ms, infer_ms, batch_id))


def _by_cost(p: Pending) -> int:
    return p.cost


def _progress(batch: list[Pending]) -> None:
    """Tell each package with items in ``batch`` that its work is moving (once per package)."""
    seen: PackageClock | None = None
    for p in batch:
        clock = p.ticket.clock
        if clock is not None and clock is not seen:
            clock.event()
            seen = clock


def _failures(results: Sequence[Any]) -> int:
    """How many items of a request failed, without reading arrays row by row."""
    errors = getattr(results, "errors", None)  # EmbedColumns: the model's error per row
    if isinstance(errors, list):
        return sum(1 for e in errors if e)
    return sum(isinstance(r, WorkerError) for r in results)
