"""A background step run every few seconds: the pattern of the sampler, ledger, budgets and policy.

A failing step is logged and tried again on the next tick (Redis restarting must not end it);
``aclose`` cancels the task and waits for it, so nothing runs after shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger()


class Periodic:
    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[object]],
        interval_s: float | Callable[[], float],
        *,
        at_once: bool = True,
    ) -> None:
        self.name = name
        self._step = step
        self._interval = interval_s if callable(interval_s) else lambda: interval_s
        self._at_once = at_once  # the first step at start, or after the first interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Idempotent."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    @property
    def running(self) -> bool:
        return self._task is not None

    async def _run(self) -> None:
        if not self._at_once:
            await asyncio.sleep(self._interval())
        while True:
            try:
                await self._step()
            except Exception as exc:  # the last good state stays in force
                log.warning(f"{self.name} failed", error=repr(exc)[:200])
            await asyncio.sleep(self._interval())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
