"""Cancel requests for jobs a worker holds: the producer sets a job's cancel flag
(``Keys.stream_cancel``, the flag a streamed job's writes already read), and this watcher
turns it into an :class:`asyncio.Event` for whoever runs the job.

While any job is watched, one pipeline of ``EXISTS`` every ``interval_s`` reads all their
flags; with none watched it sends nothing. A chat generation checks its event as it streams,
so a cancelled conversation stops (and frees its decode slot) within a step or two.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from producer.contract import Keys

from .periodic import Periodic

INTERVAL_S = 0.1


class CancelWatch:
    def __init__(self, redis: Any, keys: Keys, interval_s: float = INTERVAL_S) -> None:
        self._redis = redis
        self._keys = keys
        self._events: dict[str, asyncio.Event] = {}
        self._task = Periodic("cancel watch", self.poll, interval_s, at_once=False)

    def watch(self, job_id: str) -> asyncio.Event:
        """The event set once ``job_id``'s cancel flag is seen; starts polling if needed."""
        event = self._events.setdefault(job_id, asyncio.Event())
        self._task.start()
        return event

    def unwatch(self, job_id: str) -> None:
        self._events.pop(job_id, None)

    async def poll(self) -> None:
        ids = [job_id for job_id, event in self._events.items() if not event.is_set()]
        if not ids:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.exists(self._keys.stream_cancel(job_id))
            found = await pipe.execute()
        for job_id, flag in zip(ids, found, strict=True):
            event = self._events.get(job_id)
            if flag and event is not None:
                event.set()

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._task.aclose()
