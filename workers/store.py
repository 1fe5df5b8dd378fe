"""Redis side of the worker: job state transitions, result writes, re-queues.

All writes for one work package go out in as few round trips as possible: one script call
to start its items, one to finish them, one pipeline to re-queue leftovers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producer.contract import (
    LUA_FINISH,
    LUA_START,
    ErrorInfo,
    JobResult,
    Keys,
    Lane,
    Status,
    WorkItem,
    add_package,
)


class JobStore:
    def __init__(self, redis: Any, keys: Keys, result_ttl_s: int, max_result_bytes: int = 8 << 20) -> None:
        self.redis = redis
        self.keys = keys
        self.result_ttl_s = result_ttl_s
        self.max_result_bytes = max_result_bytes
        self._start = redis.register_script(LUA_START)
        self._finish = redis.register_script(LUA_FINISH)

    async def start(self, items: Sequence[WorkItem]) -> list[int]:
        """Mark items running. Per item: n > 0 its attempt number, 0 already terminal, -1 gone,
        -2 not a job record (a poisoned key; its package-mates are unaffected)."""
        if not items:
            return []
        return [int(x) for x in await self._start(keys=[self.keys.job(i.id) for i in items])]

    async def finish(self, results: Sequence[JobResult]) -> list[bool]:
        """Write terminal envelopes; a job already terminal (or not a job record) is left as it is."""
        if not results:
            return []
        keys: list[str] = []
        args: list[Any] = [self.result_ttl_s, self.keys.root]
        for r in results:
            keys += [self.keys.job(r.id), self.keys.done(r.id)]
            envelope = r.model_dump_json(exclude_none=True)
            if len(envelope) > self.max_result_bytes:
                r = self._too_big(r, len(envelope))
                envelope = r.model_dump_json(exclude_none=True)
            args += [r.status.value, envelope]
        return [int(x) == 1 for x in await self._finish(keys=keys, args=args)]

    async def record_kinds(self, job_ids: Sequence[str]) -> list[str | None]:
        """The ``kind`` field of each job record (None where there is no such record)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(self.keys.job(job_id), "kind")
            raw = await pipe.execute(raise_on_error=False)
        return [
            (r.decode() if isinstance(r, bytes) else r) if isinstance(r, bytes | str) else None for r in raw
        ]

    def _too_big(self, result: JobResult, size: int) -> JobResult:
        """The stored form of a result past the size limit: a failed job that says so."""
        message = f"the result is {size / 1e6:.1f} MB, over the {self.max_result_bytes / 1e6:.1f} MB a job may store"
        error = ErrorInfo(type="limit_exceeded", message=message)
        return result.model_copy(update={"status": Status.failed, "body": None, "error": error})

    async def requeue(
        self,
        items: Sequence[WorkItem],
        lane: Lane,
        *,
        job_try: int | None = None,
        defer_s: float = 0.0,
        parts: int = 1,
        retries: int = 0,
        crashes: int = 0,
    ) -> list[str]:
        """Queue ``items`` again as ``parts`` new packages (split to isolate a crashing item)."""
        size = max(1, -(-len(items) // parts))
        async with self.redis.pipeline(transaction=True) as pipe:
            ids = [
                add_package(
                    pipe,
                    self.keys,
                    list(items[s : s + size]),
                    lane,
                    job_try=job_try,
                    defer_s=defer_s,
                    retries=retries,
                    crashes=crashes,
                )
                for s in range(0, len(items), size)
            ]
            await pipe.execute()
        return ids

    async def queue_depth(self, lane: Lane) -> int:
        return int(await self.redis.zcard(self.keys.queue(lane)))
