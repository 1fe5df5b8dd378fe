"""A package's time limit, counted from when its work starts and renewed while it progresses.

A claimed package may wait in the batchers behind work this process claimed before it. Counted
from the claim, that wait would time it out (and re-run it elsewhere) although nothing is wrong.
So :class:`PackageClock` counts the limit from the last sign of life of the package's work: a
backend batch that takes or returns one of its items, or, while its items wait in the backend's
queue, any batch the backend returns (a backend that slowed down still delivers; one that
stopped delivers nothing). Before its first item goes out, waiting counts only while the
batchers make no progress at all (then something is stuck), and never for longer than
``max_wait_s``; in all, a package runs at most ``max_run_s``. A package sized for a fast
backend therefore does not time out with nothing kept when the backend slows down: its time
limit measures a stall, not a budget.

The clock reaches the batchers through a context variable: a package sets it, and every
submission made from the package's tasks carries it (see :class:`workers.backends.local.batcher.MicroBatcher`).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
WAIT_POLL_S = 0.5  # how often a package whose work has not started checks its clock

CURRENT: contextvars.ContextVar[PackageClock | None] = contextvars.ContextVar("package_clock", default=None)


class Liveness:
    """When any backend batch of this process last came back (shared by all packages)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last_batch_at = clock()

    def batch_done(self) -> None:
        self.last_batch_at = self._clock()


LIVENESS = Liveness()


class PackageClock:
    """Decides when a package has run out of time (see the module docstring)."""

    def __init__(
        self,
        limit_s: float,
        *,
        max_wait_s: float | None = None,
        max_run_s: float | None = None,
        liveness: Liveness = LIVENESS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit_s = limit_s
        self.max_wait_s = max_wait_s if max_wait_s is not None else 3 * limit_s
        self.max_run_s = max_run_s if max_run_s is not None else 6 * limit_s
        self._liveness = liveness
        self._clock = clock
        self.claimed_at = clock()
        self.last_event_at: float | None = None  # None until its work starts

    @property
    def started(self) -> bool:
        return self.last_event_at is not None

    def event(self) -> None:
        """One of the package's items went out in a batch, or came back."""
        self.last_event_at = self._clock()

    def expired(self) -> bool:
        now = self._clock()
        if now - self.claimed_at > self.max_run_s:
            return True
        if self.last_event_at is not None:
            last_sign = max(self.last_event_at, self._liveness.last_batch_at)
            return now - last_sign > self.limit_s
        waited = now - self.claimed_at
        if waited <= self.limit_s:
            return False
        stalled = now - self._liveness.last_batch_at > self.limit_s
        return stalled or waited > self.max_wait_s

    def remaining_s(self) -> float:
        """Seconds until the earliest moment :meth:`expired` could turn true."""
        now = self._clock()
        if self.last_event_at is not None:
            last_sign = max(self.last_event_at, self._liveness.last_batch_at)
            return max(0.0, last_sign + self.limit_s - now)
        return max(0.0, self.claimed_at + self.limit_s - now)


async def within(clock: PackageClock, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` with ``clock`` as its package's time limit; raise TimeoutError when it runs
    out (``work`` is cancelled first). The clock is visible to everything ``work`` submits."""
    context = contextvars.copy_context()
    context.run(CURRENT.set, clock)
    task = asyncio.get_running_loop().create_task(work, context=context)
    try:
        while True:
            # Sleep until the limit could pass; while waiting to start, look again now and then.
            done, _ = await asyncio.wait({task}, timeout=clock.remaining_s() or WAIT_POLL_S)
            if done:
                return task.result()
            if clock.expired():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise TimeoutError
    except asyncio.CancelledError:
        task.cancel()
        raise


def mark() -> None:
    """Note progress on the current package's clock, if the caller runs inside one."""
    clock = CURRENT.get()
    if clock is not None:
        clock.event()
