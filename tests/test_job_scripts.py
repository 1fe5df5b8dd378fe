"""The job scripts on a real Redis: what a finish writes besides the result, at what cost.

A finish appends the terminal event to a streamed job's stream and to its producer's reply
list. Whether a job has a stream is written in its record when it is queued, so a job without
one costs Redis no lookup; a record written before that field existed still gets its event.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer.contract import (
    LUA_FINISH,
    LUA_SUBMIT,
    REPLY_TTL_S,
    Keys,
    add_stream,
    connect,
)


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
