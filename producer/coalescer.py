"""Coalescer: pack concurrent single submissions into multi-item work packages.

arq costs the worker about 0.7 ms of CPU per job, so one arq job per request caps a worker near
1.5 k requests/s whatever the GPU could do. Requests that arrive within ``window_ms`` of each
other for the same kind, model and lane are written as one package (up to ``max_items``).
A lone request waits at most the window; a full group goes out at once.

The window adapts to traffic: each group keeps a moving average of the gap between its
arrivals, and a request that finds no package open waits only if another request is expected
within the window. So a lone request goes out at once, and under load packages fill.

Each item keeps its own id and record: packing changes how jobs travel, not what they are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from .jobs import WorkItem

Enqueue = Callable[[Sequence[WorkItem]], Awaitable[None]]
GroupKey = tuple[str, str, str]

# Weight of the newest gap in the moving average (about the last 10 arrivals count).
GAP_WEIGHT = 0.1


def group_key(item: WorkItem) -> GroupKey:
    model = item.body.get("model", "") if isinstance(item.body, dict) else ""
    return (item.kind.value, str(model), item.lane.value)


class Coalescer:
    def __init__(self, enqueue: Enqueue, *, window_ms: float = 1.0, max_items: int = 32) -> None:
        if window_ms < 0 or max_items < 1:
            raise ValueError("window_ms must be >= 0 and max_items >= 1")
        self._enqueue = enqueue
        self.window_s = window_ms / 1000
        self.max_items = max_items
        self._groups: dict[GroupKey, list[tuple[WorkItem, asyncio.Future[None]]]] = {}
        self._timers: dict[GroupKey, asyncio.TimerHandle] = {}
        self._last: dict[GroupKey, float] = {}  # the group's latest arrival
        self._gap: dict[GroupKey, float] = {}  # moving average of its inter-arrival gap (s)
        self._tasks: set[asyncio.Task[None]] = set()

    async def add(self, item: WorkItem) -> None:
        """Queue ``item``; returns once its package is in Redis (raises if that write failed)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        key = group_key(item)
        group = self._groups.setdefault(key, [])
        group.append((item, future))
        gap = self._observe(key)
        if len(group) >= self.max_items:
            self._flush(key)
        elif key not in self._timers:
            # Another request likely within the window: wait for it. Otherwise go out once this
            # loop iteration ends, so requests made together (a gather) still share a package.
            wait = self.window_s if gap < self.window_s else 0.0
            self._timers[key] = loop.call_later(wait, self._flush, key)
        await future

    def _observe(self, key: GroupKey) -> float:
        """Record an arrival; the group's average gap between arrivals, in seconds."""
        now = time.monotonic()
        last = self._last.get(key)
        self._last[key] = now
        if last is None:
            return float("inf")
        gap = self._gap.get(key)
        new = now - last if gap is None else gap + GAP_WEIGHT * ((now - last) - gap)
        self._gap[key] = new
        return new

    def _flush(self, key: GroupKey) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        group = self._groups.pop(key, [])
        if group:
            task = asyncio.ensure_future(self._write(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self, group: list[tuple[WorkItem, asyncio.Future[None]]]) -> None:
        try:
            await self._enqueue([item for item, _ in group])
        except Exception as exc:  # every waiter learns its submission failed
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            return
        for _, future in group:
            if not future.done():
                future.set_result(None)

    async def aclose(self) -> None:
        """Write whatever is still waiting, then return."""
        for key in list(self._groups):
            self._flush(key)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
