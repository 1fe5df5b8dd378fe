"""Redis side of the worker: job state transitions, result writes, re-queues.

All writes for one work package go out in as few round trips as possible: one script call
to start its items, one to finish them, one pipeline to re-queue leftovers. Jobs of a bulk
chunk (``producer/contract/chunks.py``) are fields of their chunk's record: the chunk scripts
start and finish them, one call per chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from producer.contract import (
    LUA_BLOCK_START,
    LUA_BLOCK_WRITE,
    LUA_CHUNK_FINISH,
    LUA_CHUNK_START,
    LUA_FINISH,
    LUA_START,
    ErrorInfo,
    ErrorType,
    JobResult,
    Keys,
    Lane,
    Status,
    WorkItem,
    add_package,
    block_field,
    group_by_chunk,
)


class JobStore:
    def __init__(self, redis: Any, keys: Keys, result_ttl_s: int, max_result_bytes: int = 8 << 20) -> None:
        self.redis = redis
        self.keys = keys
        self.result_ttl_s = result_ttl_s
        self.max_result_bytes = max_result_bytes
        self._start = redis.register_script(LUA_START)
        self._finish = redis.register_script(LUA_FINISH)
        self._chunk_start = redis.register_script(LUA_CHUNK_START)
        self._chunk_finish = redis.register_script(LUA_CHUNK_FINISH)
        self._block_start = redis.register_script(LUA_BLOCK_START)
        self._block_write = redis.register_script(LUA_BLOCK_WRITE)

    async def start(self, items: Sequence[WorkItem]) -> list[int]:
        """Mark items running. Per item: n > 0 its attempt number, 0 already terminal, -1 gone,
        -2 not a job record (a poisoned key; its package-mates are unaffected)."""
        if not items:
            return []
        plain, chunks = group_by_chunk([i.id for i in items])
        out = [0] * len(items)
        if plain:
            flags = await self._start(keys=[self.keys.job(items[p].id) for p in plain])
            for p, flag in zip(plain, flags, strict=True):
                out[p] = int(flag)
        for chunk_id, jobs in chunks.items():
            flags = await self._chunk_start(keys=[self.keys.chunk(chunk_id)], args=[i for _, i in jobs])
            for (p, _), flag in zip(jobs, flags, strict=True):
                out[p] = int(flag)
        return out

    async def start_block(self, chunk_id: str, indices: Sequence[int]) -> tuple[list[int], int]:
        """:meth:`start` for the jobs of a chunk that runs as a block (``workers/blocks/``), by
        index; also the first of the block numbers reserved for the run (0: none were left)."""
        flags = await self._block_start(keys=[self.keys.chunk(chunk_id)], args=list(indices))
        return [int(f) for f in flags[:-1]], int(flags[-1])

    async def write_blocks(
        self, chunk_id: str, blocks: Sequence[tuple[int, bytes, Sequence[int]]]
    ) -> list[list[int]]:
        """Write result blocks of one chunk, (number, bytes, the chunk index of each row), in one
        round trip: one ``HSET`` of them all and one ``block_write.lua`` call. Per block, per
        row: 1 written, 0 already terminal, < 0 not written."""
        key = self.keys.chunk(chunk_id)
        args: list[Any] = [self.result_ttl_s]
        fields: dict[str, bytes] = {}
        for number, blob, indices in blocks:
            fields[block_field(number)] = blob
            args += [number, len(indices), *indices]
        sha = self._block_write.sha
        for _ in range(2):
            # EVALSHA itself: a pipeline that carries a registered script first asks SCRIPT
            # EXISTS, a round trip more per write. A Redis that lost its scripts says NOSCRIPT
            # (the HSET beside it is written again, the same value): load it, write again.
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hset(key, mapping=fields)  # type: ignore[arg-type]  # bytes values
                pipe.evalsha(sha, 1, key, *args)
                stored, replies = await pipe.execute(raise_on_error=False)
            if not isinstance(replies, NoScriptError):
                break
            await self.redis.script_load(self._block_write.script)
        for reply in (stored, replies):
            if isinstance(reply, Exception):
                raise reply
        return [[int(f) for f in reply] for reply in replies]

    async def finish(self, results: Sequence[JobResult]) -> list[bool]:
        """Write terminal envelopes; a job already terminal (or not a job record) is left as it is."""
        if not results:
            return []
        envelopes = [self._envelope(r) for r in results]
        plain, chunks = group_by_chunk([r.id for r in results])
        out = [False] * len(results)
        if plain:
            keys: list[str] = []
            args: list[Any] = [self.result_ttl_s, self.keys.root]
            for p in plain:
                keys += [self.keys.job(results[p].id), self.keys.done(results[p].id)]
                args += [envelopes[p][0], envelopes[p][1]]
            for p, flag in zip(plain, await self._finish(keys=keys, args=args), strict=True):
                out[p] = int(flag) == 1
        for chunk_id, jobs in chunks.items():
            args = [self.result_ttl_s]
            for p, index in jobs:
                args += [index, envelopes[p][1]]
            flags = await self._chunk_finish(keys=[self.keys.chunk(chunk_id)], args=args)
            for (p, _), flag in zip(jobs, flags, strict=True):
                out[p] = int(flag) == 1
        return out

    def _envelope(self, result: JobResult) -> tuple[str, str]:
        """The status and JSON envelope stored for ``result`` (a failure if it is too big)."""
        envelope = result.model_dump_json(exclude_none=True)
        if len(envelope) > self.max_result_bytes:
            result = self._too_big(result, len(envelope))
            envelope = result.model_dump_json(exclude_none=True)
        return result.status.value, envelope

    async def record_kinds(self, job_ids: Sequence[str]) -> list[str | None]:
        """The ``kind`` field of each job record (None where there is no such record)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(self.keys.record(job_id), "kind")
            raw = await pipe.execute(raise_on_error=False)
        return [
            (r.decode() if isinstance(r, bytes) else r) if isinstance(r, bytes | str) else None for r in raw
        ]

    def _too_big(self, result: JobResult, size: int) -> JobResult:
        """The stored form of a result past the size limit: a failed job that says so."""
        message = f"the result is {size / 1e6:.1f} MB, over the {self.max_result_bytes / 1e6:.1f} MB a job may store"
        error = ErrorInfo(type=ErrorType.limit_exceeded, message=message)
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
        order_us: int | None = None,
    ) -> list[str]:
        """Queue ``items`` again as ``parts`` new packages (split to isolate a crashing item);
        ``order_us``, the first package's, keeps their place in their tenant's line."""
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
                    order_us=order_us,
                )
                for s in range(0, len(items), size)
            ]
            await pipe.execute()
        return ids

    async def queue_depth(self, lane: Lane) -> int:
        return int(await self.redis.zcard(self.keys.queue(lane)))
