"""The job scripts on a real Redis: what a finish writes besides the result, at what cost.

A finish appends the terminal event to a streamed job's stream and to its producer's reply
list. A chunk's scripts read and write a call's jobs in one command each. Whether a job has a stream is written in its record when it is queued, so a job without
one costs Redis no lookup; a record written before that field existed still gets its event.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer.contract import (
    IN_ENVELOPE,
    LUA_BLOCK_START,
    LUA_BLOCK_WRITE,
    LUA_CHUNK_FINISH,
    LUA_CHUNK_START,
    LUA_FINISH,
    LUA_SUBMIT,
    REPLY_TTL_S,
    Keys,
    add_stream,
    attempts_map,
    connect,
    locations,
)
from stack.processes import free_port, redis_process


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = connect(redis_url)
    yield client
    await client.aclose()


def _record(*, reply: str = "", stream: str | None = "0") -> list[Any]:
    args: list[Any] = [600, "embed", "default", "interactive", "1.0", "", reply]
    return [*args, stream] if stream is not None else args


async def _queue(redis: aioredis.Redis, keys: Keys, job_id: str, **record: Any) -> None:
    await redis.eval(LUA_SUBMIT, 1, keys.job(job_id), *_record(**record))


async def _finish(redis: aioredis.Redis, keys: Keys, job_id: str) -> list[int]:
    envelope = json.dumps({"id": job_id, "status": "succeeded"})
    keys_args = [keys.job(job_id), keys.done(job_id)]
    return await redis.eval(LUA_FINISH, 2, *keys_args, 600, keys.root, "succeeded", envelope)  # type: ignore[no-any-return]


async def _stream_of(redis: aioredis.Redis, keys: Keys, job_id: str) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        add_stream(pipe, keys, job_id)
        await pipe.execute()


def _job() -> str:
    return secrets.token_hex(12)


class TestStreams:
    async def test_a_streamed_job_ends_its_stream_with_the_terminal_event(
        self, redis: aioredis.Redis
    ) -> None:
        keys, job = Keys(f"t{secrets.token_hex(4)}"), _job()
        await _queue(redis, keys, job, stream="1")
        await _stream_of(redis, keys, job)
        assert await _finish(redis, keys, job) == [1]
        entries = await redis.xrange(keys.stream(job))
        assert [e[1]["data"] for e in entries][-1] == json.dumps({"id": job, "status": "succeeded"})
        assert [e[1]["event"] for e in entries] == ["status", "status"]

    async def test_a_job_without_a_stream_gets_none(self, redis: aioredis.Redis) -> None:
        keys, job = Keys(f"t{secrets.token_hex(4)}"), _job()
        await _queue(redis, keys, job, stream="0")
        assert await _finish(redis, keys, job) == [1]
        assert not await redis.exists(keys.stream(job))
        assert (await redis.hgetall(keys.job(job)))["status"] == "succeeded"

    async def test_a_record_from_before_the_stream_field_still_gets_its_event(
        self, redis: aioredis.Redis
    ) -> None:
        keys, job, plain = Keys(f"t{secrets.token_hex(4)}"), _job(), _job()
        for job_id in (job, plain):
            await _queue(redis, keys, job_id, stream="0")
            await redis.hdel(keys.job(job_id), "stream")
        await _stream_of(redis, keys, job)
        assert await _finish(redis, keys, job) == [1]
        assert await _finish(redis, keys, plain) == [1]
        assert len(await redis.xrange(keys.stream(job))) == 2
        assert not await redis.exists(keys.stream(plain))

    async def test_a_stream_that_expired_is_not_recreated(self, redis: aioredis.Redis) -> None:
        keys, job = Keys(f"t{secrets.token_hex(4)}"), _job()
        await _queue(redis, keys, job, stream="1")
        assert await _finish(redis, keys, job) == [1]
        assert not await redis.exists(keys.stream(job))

    async def test_a_stream_key_of_another_type_does_not_stop_the_result(self, redis: aioredis.Redis) -> None:
        keys, job = Keys(f"t{secrets.token_hex(4)}"), _job()
        await _queue(redis, keys, job, stream="1")
        await redis.set(keys.stream(job), "not a stream")
        assert await _finish(redis, keys, job) == [1]
        assert await redis.get(keys.stream(job)) == "not a stream"
        assert (await redis.hgetall(keys.job(job)))["status"] == "succeeded"


class TestReplyList:
    async def test_one_finish_of_many_jobs_pushes_each_reply_list_once_in_job_order(
        self, redis: aioredis.Redis
    ) -> None:
        keys = Keys(f"t{secrets.token_hex(4)}")
        lists = [keys.reply(secrets.token_hex(8)) for _ in range(2)]
        jobs = [_job() for _ in range(6)]
        for n, job in enumerate(jobs):
            await _queue(redis, keys, job, reply=lists[n % 2])
        args: list[Any] = [600, keys.root]
        for job in jobs:
            args += ["succeeded", json.dumps({"id": job, "status": "succeeded"})]
        job_keys = [k for job in jobs for k in (keys.job(job), keys.done(job))]
        script = redis.register_script(LUA_FINISH)
        assert await script(keys=job_keys, args=args) == [1] * 6
        for n, reply in enumerate(lists):
            got = await redis.lrange(reply, 0, -1)
            assert [g.split(" ", 1)[0] for g in got] == jobs[n::2]
            assert 0 < await redis.ttl(reply) <= REPLY_TTL_S

    async def test_the_list_lives_from_its_first_push_and_is_renewed_while_it_grows(
        self, redis: aioredis.Redis
    ) -> None:
        keys = Keys(f"t{secrets.token_hex(4)}")
        reply = keys.reply(secrets.token_hex(8))
        jobs = [_job() for _ in range(300)]
        for job in jobs:
            await _queue(redis, keys, job, reply=reply)
        assert await _finish(redis, keys, jobs[0]) == [1]
        assert 0 < await redis.ttl(reply) <= REPLY_TTL_S
        await redis.expire(reply, 5)  # as if time passed since it was set
        for job in jobs[1:255]:
            await _finish(redis, keys, job)
        assert await redis.ttl(reply) <= 5  # not renewed on every push
        await _finish(redis, keys, jobs[255])  # the 256th
        assert await redis.ttl(reply) > 5
        assert await redis.llen(reply) == 256
        first = await redis.lindex(reply, 0)
        assert first is not None and first.startswith(jobs[0] + " ")

    async def test_a_list_emptied_by_its_reader_starts_a_new_lifetime(self, redis: aioredis.Redis) -> None:
        keys = Keys(f"t{secrets.token_hex(4)}")
        reply = keys.reply(secrets.token_hex(8))
        first, second = _job(), _job()
        for job in (first, second):
            await _queue(redis, keys, job, reply=reply)
        await _finish(redis, keys, first)
        await redis.lpop(reply)
        assert not await redis.exists(reply)
        await _finish(redis, keys, second)
        assert 0 < await redis.ttl(reply) <= REPLY_TTL_S


class TestChunkScripts:
    """A chunk's start and finish cost Redis a few commands per call, not a few per job."""

    @staticmethod
    async def calls(redis: aioredis.Redis) -> int:
        stats = await redis.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_evalsha"))

    async def test_start_counts_attempts_and_finish_writes_each_job_once(self, redis: aioredis.Redis) -> None:
        key = f"t-chunk-{secrets.token_hex(4)}"
        # job 1 is terminal: its location (field x, a uint16 per job) says its envelope is r1
        x = b"\0\0\xff\xff" + b"\0" * 6
        await redis.hset(key, mapping={"n": 5, "r1": "done", "x": x})
        start, finish = redis.register_script(LUA_CHUNK_START), redis.register_script(LUA_CHUNK_FINISH)
        assert await start(keys=[key], args=[0, 1, 2, 3, 0, 7, "x"]) == [1, 0, 1, 1, 2, -1, -1]
        assert attempts_map(await redis.hget(key, "y"), 5).tolist() == [2, 0, 1, 1, 0]  # a byte per job
        assert await finish(keys=[key], args=[60, 0, "e0", 1, "late", 0, "again", 3, "e3"]) == [1, 0, 0, 1]
        assert await redis.hmget(key, ["r0", "r1", "r3", "d"]) == ["e0", "done", "e3", "2"]
        assert 0 < await redis.ttl(key) <= 60
        assert await start(keys=[f"{key}-none"], args=[0]) == [-1]
        assert await finish(keys=[f"{key}-none"], args=[60, 0, "e"]) == [-2]

    async def test_a_block_writes_the_jobs_not_yet_terminal_and_says_where_they_are(
        self, redis: aioredis.Redis
    ) -> None:
        key = f"t-chunk-{secrets.token_hex(4)}"
        await redis.hset(key, "n", 4)
        start = redis.register_script(LUA_BLOCK_START)
        write, finish = redis.register_script(LUA_BLOCK_WRITE), redis.register_script(LUA_CHUNK_FINISH)
        assert await finish(keys=[key], args=[60, 2, "failed alone"]) == [1]
        assert await start(keys=[key], args=[0, 1, 2, 3]) == [1, 1, 0, 1, 1]  # block numbers 1..3 reserved
        assert await start(keys=[key], args=[3]) == [2, 4]  # a second run reserves past them

        async def blocks(*written: tuple[int, bytes, list[int]]) -> list[list[int]]:
            args: list[Any] = [60]
            for number, value, indices in written:
                await redis.hset(key, f"b{number}", value)
                args += [number, len(indices), *indices]
            return list(await write(keys=[key], args=args))

        assert await blocks((1, b"first", [0, 2, 9])) == [[1, 0, -1]]
        # several blocks in one call: a row the first one took is terminal for the second
        assert await blocks((2, b"second", [3, 0]), (3, b"all late", [0, 3])) == [[1, 0], [0, 0]]
        assert await redis.hexists(key, "b3") == 0  # no row of it counts: the block goes
        assert await finish(keys=[key], args=[60, 3, "late"]) == [0]
        assert locations(await redis.hget(key, "x"), 4).tolist() == [1, 0, IN_ENVELOPE, 2]
        assert await redis.hmget(key, ["b1", "b2", "b3", "d"]) == ["first", "second", None, "3"]
        assert 0 < await redis.ttl(key) <= 60
        assert await write(keys=[f"{key}-none"], args=[60, 1, 1, 0]) == [[-2]]

    async def test_a_call_costs_the_same_commands_for_ten_jobs_or_five_thousand(self, tmp_path: Path) -> None:
        # A Redis of its own: the session's workers poll the shared one while this counts.
        port = free_port()
        server = redis_process(port, tmp_path, appendonly=False).start()
        redis = connect(f"redis://127.0.0.1:{port}/0")
        try:
            cost = await self.cost_of_calls(redis)
        finally:
            await redis.aclose()
            server.stop()
        assert cost[0] <= 12 and cost[1] <= cost[0] + 10, cost  # slices of 4 000 values: a few more

    async def cost_of_calls(self, redis: aioredis.Redis) -> list[int]:
        start, finish = redis.register_script(LUA_CHUNK_START), redis.register_script(LUA_CHUNK_FINISH)
        cost = []
        for jobs in (10, 5000):
            key = f"t-chunk-{secrets.token_hex(4)}"
            await redis.hset(key, "n", jobs)
            before = await self.calls(redis)
            assert await start(keys=[key], args=list(range(jobs))) == [1] * jobs
            args: list[Any] = [60]
            for i in range(jobs):
                args += [i, f"e{i}"]
            assert await finish(keys=[key], args=args) == [1] * jobs
            cost.append(await self.calls(redis) - before)
            assert await redis.hget(key, "d") == str(jobs)
        return cost


async def test_blocks_are_written_when_redis_lost_its_scripts(tmp_path: Path) -> None:
    """The worker sends EVALSHA itself beside a block's HSET (no SCRIPT EXISTS round trip): a
    Redis restarted without its scripts answers NOSCRIPT, and the write loads it and goes again."""
    from workers.jobs.store import JobStore

    port = free_port()
    server = redis_process(port, tmp_path, appendonly=False).start()
    redis = connect(f"redis://127.0.0.1:{port}/0")
    try:
        store = JobStore(redis, Keys("t-noscript"), 60)
        chunk = "chk_" + secrets.token_hex(12)
        await redis.hset(store.keys.chunk(chunk), "n", 3)
        flags, first = await store.start_block(chunk, [0, 1, 2])
        assert flags == [1, 1, 1] and first == 1
        await redis.script_flush()
        assert await store.write_blocks(chunk, [(first, b"rows", [0, 2]), (first + 1, b"row", [1])]) == [
            [1, 1],
            [1],
        ]
        assert await redis.hmget(store.keys.chunk(chunk), ["b1", "b2", "d"]) == ["rows", "row", "3"]
    finally:
        await redis.aclose()
        server.stop()
