"""TickFlusher: what is handed over within one event-loop tick is written in one go.

The results of a backend batch settle in one tick; a flush task starts on the first of them,
yields once so the rest of that tick's come in, and writes what gathered, then whatever came
meanwhile, until nothing is left. :meth:`drain` waits for the last write and re-raises its
error (Redis unreachable: the package's run handles it). Subclasses say what a flush takes
(:meth:`_take`) and how it is written (:meth:`_write`).
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

B = TypeVar("B")


class TickFlusher(Generic[B]):
    def __init__(self, name: str) -> None:
        self._name = name
        self._flusher: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    def _schedule(self) -> None:
        """Something was handed over: make sure a flush is on its way."""
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name=self._name)

    async def drain(self) -> None:
        """Wait until everything handed over is written; re-raise a write's error (Redis)."""
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
        if self._error is not None:
            raise self._error

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)  # the rest of the same tick's results come in meanwhile
            while self._error is None and (batch := self._take()) is not None:
                await self._write(batch)
        except Exception as exc:  # Redis unreachable: the package's run re-raises it
            self._error = exc
        finally:
            self._flusher = None

    def _take(self) -> B | None:
        """What was handed over since the last take (None: nothing)."""
        raise NotImplementedError

    async def _write(self, batch: B) -> None:
        raise NotImplementedError
