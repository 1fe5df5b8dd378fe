"""BatchDriver: the background task that steps every active batch."""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from redis.exceptions import RedisError

from .engine import BatchEngine
from .lease import LeaseLost

log = structlog.get_logger("producer.batches")


class BatchDriver:
    """Steps every active batch in the background: every ``batch_poll_s``, or at once on :meth:`poke`."""

    def __init__(self, engine: BatchEngine) -> None:
        self.engine = engine
        self._steps: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._closing = False
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="batch-driver")

    def poke(self) -> None:
        self._wake.set()

    async def aclose(self) -> None:
        self._closing = True
        tasks = [t for t in (self._loop, *self._steps.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        while not self._closing:
            try:
                await self._tick()
            except (RedisError, OSError) as exc:
                log.warning("batch driver cannot reach redis", error=str(exc)[:200])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.engine.settings.batch_poll_s)
            self._wake.clear()

    async def _tick(self) -> None:
        for batch_id in await self.engine.active():
            if batch_id not in self._steps:
                self._steps[batch_id] = asyncio.create_task(self._step(batch_id), name=f"batch-{batch_id}")

    async def _step(self, batch_id: str) -> None:
        try:
            await self.engine.step(batch_id)
        except LeaseLost:
            log.warning("batch lease lost; another driver continues", batch_id=batch_id)
        except (RedisError, OSError) as exc:
            log.warning("batch step failed; retried next tick", batch_id=batch_id, error=str(exc)[:200])
        except Exception as exc:
            log.exception("batch step crashed; retried next tick", batch_id=batch_id)
            with contextlib.suppress(RedisError, OSError):
                await self.engine.step_failed(batch_id, exc)
        finally:
            self._steps.pop(batch_id, None)
