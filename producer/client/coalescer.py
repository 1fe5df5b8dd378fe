"""Coalescer: pack concurrent single submissions into multi-item work packages.

arq costs the worker about 0.7 ms of CPU per job, so one arq job per request caps a worker near
1.5 k requests/s whatever the GPU could do. Requests that arrive within ``window_ms`` of each
other for the same kind, model and lane are written as one package (up to ``max_items``, and
up to ``max_bytes`` of request bodies, so a few huge requests do not make one huge package).
A lone request waits at most the window; a full group goes out at once.

The window adapts to traffic: each group keeps a moving average of the gap between its
arrivals, and a request that finds no package open waits only if another request is expected
within the window. So a lone request goes out at once, and under load packages fill.

Each item keeps its own id and record: packing changes how jobs travel, not what they are.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from redis.exceptions import RedisError

from ..contract import WorkItem

Enqueue = Callable[[Sequence[WorkItem]], Awaitable[None]]
GroupKey = tuple[str, str, str, str]

# Weight of the newest gap in the moving average (about the last 10 arrivals count).
GAP_WEIGHT = 0.1
# Groups whose arrival statistics are kept (least recently seen forgotten first).
MAX_TRACKED = 1024
# Request-body bytes a package carries at most (one item larger than this travels alone).
MAX_PACKAGE_BYTES = 1 << 20


def body_bytes(body: Any) -> int:
    """About how many bytes ``body`` takes on the wire: its strings, plus a little per value.
    Loops, not generators, and strings counted in place: it runs once or twice per job
    (6.6 % of an interactive client's CPU as a recursive ``sum`` of generators)."""
    kind = type(body)
    if kind is str:
        return len(body) + 2
    n = 2
    if kind is dict or isinstance(body, dict):
        for k, v in body.items():
            n += len(k) + 4 + (len(v) + 2 if type(v) is str else body_bytes(v))
        return n
    if kind is list or isinstance(body, list | tuple):
        for v in body:
            n += 1 + (len(v) + 2 if type(v) is str else body_bytes(v))
        return n
    return 8


def split(items: Sequence[WorkItem], max_items: int, max_bytes: int) -> Iterator[list[WorkItem]]:
    """Consecutive packages of at most ``max_items`` items and (but for a lone item) ``max_bytes``."""
    package: list[WorkItem] = []
    size = 0
    for item in items:
        n = body_bytes(item.body)
        if package and (len(package) >= max_items or size + n > max_bytes):
            yield package
            package, size = [], 0
        package.append(item)
        size += n
    if package:
        yield package


def group_key(item: WorkItem) -> GroupKey:
    model = item.body.get("model", "") if isinstance(item.body, dict) else ""
    # A package holds one tenant's jobs: the lanes are shared fairly between tenants.
    return (item.kind.value, str(model), item.lane.value, item.tenant)


class Coalescer:
    def __init__(
        self,
        enqueue: Enqueue,
        *,
        window_ms: float = 1.0,
        max_items: int = 32,
        max_bytes: int = MAX_PACKAGE_BYTES,
    ) -> None:
        if window_ms < 0 or max_items < 1 or max_bytes < 1:
            raise ValueError("window_ms must be >= 0, max_items and max_bytes >= 1")
        self._enqueue = enqueue
        self.window_s = window_ms / 1000
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._groups: dict[GroupKey, list[tuple[WorkItem, asyncio.Future[None]]]] = {}
        self._bytes: dict[GroupKey, int] = {}
        self._timers: dict[GroupKey, asyncio.TimerHandle] = {}
        # Arrival statistics per group, for the most recent MAX_TRACKED groups only: the model
        # name comes from the request, and a stream of made-up names must not grow memory.
        self._last: OrderedDict[GroupKey, float] = OrderedDict()  # the group's latest arrival
        self._gap: dict[GroupKey, float] = {}  # moving average of its inter-arrival gap (s)
        self._tasks: set[asyncio.Task[None]] = set()

    async def add(self, item: WorkItem) -> None:
        """Queue ``item``; returns once its package is in Redis (raises if that write failed)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        key = group_key(item)
        size = body_bytes(item.body)
        if key in self._groups and self._bytes[key] + size > self.max_bytes:
            self._flush(key)  # this one would overfill the open package: it starts the next
        group = self._groups.setdefault(key, [])
        group.append((item, future))
        self._bytes[key] = self._bytes.get(key, 0) + size
        gap = self._observe(key)
        if len(group) >= self.max_items or self._bytes[key] >= self.max_bytes:
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
        last = self._last.pop(key, None)
        self._last[key] = now  # now the most recent
        while len(self._last) > MAX_TRACKED:
            oldest, _ = self._last.popitem(last=False)
            self._gap.pop(oldest, None)
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
        self._bytes.pop(key, None)
        if group:
            task = asyncio.ensure_future(self._write(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self, group: list[tuple[WorkItem, asyncio.Future[None]]]) -> None:
        try:
            await self._enqueue([item for item, _ in group])
        except Exception as exc:
            if len(group) > 1 and not isinstance(exc, RedisError | OSError):
                # Not the store: an item it could not encode. Packing must not let one caller's
                # item fail the others', so each is written alone and only the offender fails.
                await asyncio.gather(*(self._write([entry]) for entry in group))
                return
            for _, future in group:  # every waiter learns its submission failed
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
