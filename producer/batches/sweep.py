"""FileSweeper: the background task that deletes expired files, record and bytes.

Every ``file_sweep_s`` it takes at most ``file_sweep_batch`` files whose expiry has come (an
index sorted by expiry, so a tick costs what it deletes, not what is stored) and removes each
with the same script as ``DELETE /v1/files``. A file an active batch still reads is tried
again a minute later. Several API processes may sweep at once: the script deletes a file once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from redis.exceptions import RedisError

from .files import FileStore

log = structlog.get_logger("producer.batches")

IN_USE_RETRY_S = 60.0  # how soon an expired file still read by a batch is looked at again


class FileSweeper:
    """Deletes expired files in the background, ``batch`` per tick at most."""

    def __init__(self, files: FileStore, every_s: float, batch: int) -> None:
        self.files = files
        self.every_s = every_s
        self.batch = batch
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="file-sweep")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            swept = 0
            try:
                swept = await self.sweep()
            except (RedisError, OSError) as exc:
                log.warning("file sweep failed; retried next tick", error=str(exc)[:200])
            except Exception:
                log.exception("file sweep failed; retried next tick")
            # A full tick means more are due: go on at once rather than fall behind.
            await asyncio.sleep(0 if swept >= self.batch else self.every_s)

    async def sweep(self) -> int:
        """One tick: the files found due (deleted, gone, or still in use); how many."""
        due = await self.files.due(self.batch)
        deleted = 0
        for file_id in due:
            outcome = await self.files.expire(
                file_id, retry_at=time.time() + max(self.every_s, IN_USE_RETRY_S)
            )
            deleted += outcome == "deleted"
        if due:
            log.info("expired files swept", due=len(due), deleted=deleted)
        return len(due)
