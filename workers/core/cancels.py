"""Cancel requests for jobs a worker holds: the producer sets a job's cancel flag
(``Keys.stream_cancel``, the flag a streamed job's writes already read) and raises the cancel
epoch (``Keys.cancel_epoch``); this watcher acts on both.

- A chat generation watches its job's flag: while any is watched, one pipeline of ``EXISTS``
  every ``interval_s`` reads their flags and sets the :class:`asyncio.Event` of each found, so
  a cancelled conversation stops (and frees its decode slot) within a step or two.
- Inputs waiting in a batcher are not watched one by one (a bulk backlog holds thousands):
  the same poll reads the epoch, and only when it moved are the waiting jobs' flags read, in
  one pipeline, and the cancelled ones' inputs taken out of their batchers (the sweepers).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from producer.contract import Keys

from .periodic import Periodic

INTERVAL_S = 0.1
SWEEP_PAGE = 1000  # flags read per pipeline when sweeping

Waiting = Callable[[], set[str]]  # the jobs with inputs waiting (not yet sent out)
Drop = Callable[[set[str]], Any]  # take those jobs' inputs out


class CancelWatch:
    def __init__(self, redis: Any, keys: Keys, interval_s: float = INTERVAL_S) -> None:
        self._redis = redis
        self._keys = keys
        self._events: dict[str, asyncio.Event] = {}
        self._sweepers: list[tuple[Waiting, Drop]] = []
        self._epoch: Any = None  # the cancel epoch last seen
        self._task = Periodic("cancel watch", self.poll, interval_s, at_once=False)

    def watch(self, job_id: str) -> asyncio.Event:
        """The event set once ``job_id``'s cancel flag is seen; starts polling if needed."""
        event = self._events.setdefault(job_id, asyncio.Event())
        self._task.start()
        return event

    def unwatch(self, job_id: str) -> None:
        self._events.pop(job_id, None)

    def sweep(self, waiting: Waiting, drop: Drop) -> None:
        """Have the jobs ``waiting()`` names checked whenever a cancel was requested."""
        self._sweepers.append((waiting, drop))

    def start(self) -> None:
        """Poll from now on (idempotent; needs the running loop)."""
        self._task.start()

    async def poll(self) -> None:
        ids = [job_id for job_id, event in self._events.items() if not event.is_set()]
        if not ids and not self._sweepers:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self._keys.cancel_epoch())
            for job_id in ids:
                pipe.exists(self._keys.stream_cancel(job_id))
            epoch, *found = await pipe.execute()
        for job_id, flag in zip(ids, found, strict=True):
            event = self._events.get(job_id)
            if flag and event is not None:
                event.set()
        if epoch != self._epoch:
            self._epoch = epoch
            await self._sweep()

    async def _sweep(self) -> None:
        waiting = sorted(set().union(*(waiting() for waiting, _ in self._sweepers)))
        cancelled: set[str] = set()
        for start in range(0, len(waiting), SWEEP_PAGE):
            page = waiting[start : start + SWEEP_PAGE]
            async with self._redis.pipeline(transaction=False) as pipe:
                for job_id in page:
                    pipe.exists(self._keys.stream_cancel(job_id))
                flags = await pipe.execute()
            cancelled.update(job_id for job_id, flag in zip(page, flags, strict=True) if flag)
        if cancelled:
            for _, drop in self._sweepers:
                drop(cancelled)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._task.aclose()
