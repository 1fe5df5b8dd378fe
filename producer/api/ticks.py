"""SameTick: calls made together, for the same key, share one backend call.

An API process under load serves many requests of one tenant at once, and each would check
that tenant's rate limit and quota with its own Redis round trip. A :class:`SameTick` collects
the calls made before the event loop next runs its ready callbacks, then makes one call for
all of them. A lone call waits for nothing: it goes out as soon as the current loop
iteration ends. (The :class:`~producer.client.coalescer.Coalescer` does the same for job packages,
with a time window, because there a larger group is worth a short wait.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
A = TypeVar("A")
R = TypeVar("R")

# The shared call: a key and the arguments of every call in the group, one result per argument.
Run = Callable[[K, list[A]], Awaitable[Sequence[R]]]


class SameTick(Generic[K, A, R]):
    def __init__(self, run: Run[K, A, R]) -> None:
        self._run = run
        self._pending: dict[K, list[tuple[A, asyncio.Future[R]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, key: K, arg: A) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        group = self._pending.get(key)
        if group is None:
            group = self._pending[key] = []
            loop.call_soon(self._flush, key)
        group.append((arg, future))
        return await future

    def _flush(self, key: K) -> None:
        group = self._pending.pop(key, [])
        if group:
            task = asyncio.ensure_future(self._call(key, group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, key: K, group: list[tuple[A, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run(key, [arg for arg, _ in group])
        except Exception as exc:  # every caller learns the shared call failed
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(group, results, strict=True):
            if not future.done():
                future.set_result(result)
