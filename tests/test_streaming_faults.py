"""Streamed chat when things go wrong: a disconnect cancels and stops generation, per-tenant
stream limits, idle streams, a remote failing before or after the first token, a worker
SIGKILLed mid-stream; and the hub's tick writes.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import httpx
import openai
import pytest

from producer import Client
from producer.contract import StreamEvent
from tests.conftest import WorkerFactory
from tests.fixtures_api import ApiServer
from tests.fixtures_remote import FakeRemote
from tests.fixtures_streaming import (
    IDLE_S,
    Tenants,
    chat,
    first_content,
    sdk,
    sse_events,
)

# ---------------------------------------------------------------------------- cancel and limits


class TestCancelAndLimits:
    async def test_a_disconnect_cancels_the_job_and_stops_generation(
        self, local_stack: ApiServer, stream_tenants: Tenants, stack_client: Any, redis_url: str
    ) -> None:
        client: Client = stack_client(local_stack)
        body = {**chat("Write a long story about the sea.", max_tokens=400), "temperature": 1.0}
        async with httpx.AsyncClient(base_url=local_stack.url, timeout=30) as http:
            async with http.stream(
                "POST",
                "/v1/chat/completions",
                json={**body, "stream": True},
                headers=stream_tenants.headers("acme"),
            ) as response:
                chunk_id = await first_content(response)
            left = time.monotonic()
        job = "job_" + chunk_id.removeprefix("chatcmpl-")
        result = await client.wait(job, 30)
        assert result.status == "cancelled", result
        assert time.monotonic() - left < 5
        events = [e async for e in client.stream(job)]
        generated = "".join(e.text for e in events)
        assert events[-1].data["status"] == "cancelled"
        assert len(generated.split()) < 300, "generation stopped, far short of its budget"

    async def test_concurrent_streams_per_tenant_are_limited(
        self, remote_stack: ApiServer, stream_tenants: Tenants, remote: FakeRemote
    ) -> None:
        remote.control(stream_delay_ms=300)
        body = {**chat("a b c d e f g h"), "stream": True}
        headers = stream_tenants.headers("one")
        async with httpx.AsyncClient(base_url=remote_stack.url, timeout=30) as http:
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as first:
                assert first.status_code == 200
                second = await http.post("/v1/chat/completions", json=body, headers=headers)
                other = await http.post(
                    "/v1/chat/completions", json={**body, "stream": False}, headers=headers
                )
            remote.control(stream_delay_ms=0)
            await asyncio.sleep(0.3)  # the first response's slot is released as it closes
            third = await http.post("/v1/chat/completions", json=body, headers=headers)
        assert second.status_code == 429
        assert second.json()["error"]["code"] == "too_many_streams" and "Retry-After" in second.headers
        assert other.status_code == 200, "an unstreamed request takes no stream slot"
        assert third.status_code == 200 and "data: [DONE]" in third.text

    async def test_an_idle_stream_ends_with_an_error_event(
        self, remote_stack: ApiServer, stream_tenants: Tenants, remote: FakeRemote, stack_client: Any
    ) -> None:
        client: Client = stack_client(remote_stack)
        remote.control(stream_delay_ms=(IDLE_S + 2) * 1000)
        started = time.monotonic()
        async with sdk(remote_stack, stream_tenants) as sdk_client:
            stream = await sdk_client.chat.completions.create(**chat("slow words here"), stream=True)
            ids: list[str] = []
            with pytest.raises(openai.APIError) as exc:
                async for c in stream:
                    ids.append(c.id)
        assert IDLE_S <= time.monotonic() - started < IDLE_S + 3
        assert "idle" in exc.value.message
        abandoned = await client.wait("job_" + ids[0].removeprefix("chatcmpl-"), 15)
        assert abandoned.status == "cancelled", "an idle chat stream's job is cancelled"
        async with httpx.AsyncClient(base_url=remote_stack.url, timeout=30) as http:
            submitted = await http.post(
                "/v1/jobs",
                json={"kind": "chat", "body": chat("slow again"), "options": {"stream": True}},
                headers=stream_tenants.headers("acme"),
            )
            events = await sse_events(
                http, f"/v1/jobs/{submitted.json()['id']}/events", stream_tenants.headers("acme")
            )
        assert events[-1]["event"] == "error" and events[-1]["data"]["type"] == "stream_idle_timeout"
        await client.stop_stream(submitted.json()["id"], tenant="acme")


# ---------------------------------------------------------------------------- remote failures


class TestRemoteFailures:
    async def test_a_failure_after_the_first_token_fails_the_job(
        self, remote_stack: ApiServer, stream_tenants: Tenants, remote: FakeRemote, stack_client: Any
    ) -> None:
        client: Client = stack_client(remote_stack)
        remote.control(stream_fail_after=2, stream_fail="cut")
        job = await client.submit("chat", chat("alpha beta gamma delta epsilon"), stream=True, tenant="acme")
        events = [e async for e in client.stream(job)]
        result = await client.get(job)
        assert result.status == "failed" and result.error is not None
        assert result.error.type == "stream_interrupted"
        assert [e.event for e in events][-2:] == ["error", "status"]
        assert events[-2].data["type"] == "stream_interrupted"
        assert "".join(e.text for e in events) == "echo: alpha"
        assert len(remote.requests("/v1/chat/completions")) == 1, "no failover after the first token"

        remote.control(stream_fail_after=3, stream_fail="error")
        async with sdk(remote_stack, stream_tenants) as sdk_client:
            stream = await sdk_client.chat.completions.create(**chat("one two three four"), stream=True)
            got: list[str] = []
            with pytest.raises(openai.APIError) as exc:
                async for c in stream:
                    got.append(c.choices[0].delta.content or "")
        assert "".join(got) == "echo: one two"
        assert "after the stream had begun" in exc.value.message

    async def test_a_failure_before_the_first_token_fails_over_to_local(
        self, remote_stack: ApiServer, remote: FakeRemote, stack_client: Any
    ) -> None:
        client: Client = stack_client(remote_stack)
        remote.control(mode="503")
        job = await client.submit("chat", chat("Say yes.", max_tokens=8), stream=True)
        events = [e async for e in client.stream(job)]
        result = await client.get(job)
        assert result.status == "succeeded", result
        assert result.route == "local" and result.route_reason == "failover"
        assert "".join(e.text for e in events) == result.body["choices"][0]["message"]["content"]  # type: ignore[index]
        assert not any(e.event == "error" for e in events)


# ---------------------------------------------------------------------------- SIGKILL


async def test_a_worker_killed_mid_stream_resumes_it_on_the_re_run(
    client: Client, start_worker: WorkerFactory
) -> None:
    """Decided behaviour (docs/api.md): the re-run resumes the stream. It skips the text the
    stream already carries while regenerating it; a re-run that departs from it ends the stream
    with an error event and fails the job (``stream_diverged``). Exactly one terminal state."""
    first = start_worker(package_lease_s=1)
    body = chat("Explain what a river is, in detail.", max_tokens=64)
    job = await client.submit("chat", body, stream=True)
    seen: list[StreamEvent] = []
    async for event in client.stream(job):
        seen.append(event)
        if sum(1 for e in seen if e.event == "delta") >= 3:
            break
    first.kill()
    start_worker(package_lease_s=1)
    result = await client.wait(job, 60)
    events = [e async for e in client.stream(job)]
    assert sum(1 for e in events if e.terminal) == 1 and events[-1].terminal
    assert [e.data["status"] for e in events if e.event == "status"][:3] == ["queued", "running", "running"]
    assert result.attempts == 2
    text = "".join(e.text for e in events)
    if result.status == "succeeded":
        assert text == result.body["choices"][0]["message"]["content"]  # type: ignore[index]
        assert not any(e.event == "error" for e in events)
    else:
        assert result.status == "failed" and result.error is not None
        assert result.error.type == "stream_diverged"
        assert events[-2].event == "error"
    assert 0 < await client.redis.ttl(client.keys.stream(job)) <= 600, "a finished stream expires"


# ---------------------------------------------------------------------------- the worker's writer


async def test_the_hub_writes_one_tick_as_one_entry_per_job_and_reads_cancel_flags(redis_url: str) -> None:
    import redis.asyncio as aioredis

    from producer.contract import Keys, read_range
    from workers.backends import ChatDelta
    from workers.streaming import StreamHub

    redis = aioredis.from_url(redis_url, decode_responses=True)
    keys = Keys("t-hub-" + secrets.token_hex(3))
    try:
        hub = StreamHub(redis, keys)
        a, b = hub.open("job_a"), hub.open("job_b")
        for token in ("hel", "lo", " wor", "ld"):
            a.delta(token)
        b.delta("x")
        b.delta("y", ChatDelta("y", "stop", 3, 2))
        await asyncio.gather(a.flush(), b.flush())
        entries_a = await read_range(redis, keys, "job_a")
        entries_b = await read_range(redis, keys, "job_b")
        assert [(e.event, e.text) for e in entries_a] == [("delta", "hello world")]
        assert len(entries_b) == 1 and entries_b[0].text == "xy"
        assert entries_b[0].data == {
            "text": "xy",
            "finish_reason": "stop",
            "prompt_tokens": 3,
            "completion_tokens": 2,
        }
        assert not a.cancelled
        await redis.set(keys.stream_cancel("job_a"), "1")
        a.delta("!")
        await a.flush()
        assert a.cancelled and not b.cancelled
        assert 0 < await redis.ttl(keys.stream("job_a")) <= 3600
    finally:
        await redis.aclose()
