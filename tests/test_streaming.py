"""Streamed chat through the queue, against the real API, workers, Triton and the fake remote:
the real ``openai`` SDK's streaming (sync and async), job events over SSE with resume, tenant
isolation, disconnects that cancel, limits, remote failures mid-stream, and a worker SIGKILLed
mid-stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from producer import Client, SyncClient
from producer.batches.lines import Entry, output_line, read_chunk
from producer.contract import JobKind, Limits, StreamEvent
from stack.processes import python_process
from tests.conftest import Triton, WorkerFactory, worker_env
from tests.fixtures_api import ApiServer, api_url, start_api
from tests.fixtures_remote import FakeRemote

CHAT_MODEL = "SmolLM2-135M-Instruct"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
IDLE_S = 2  # the remote stack API's idle-stream timeout


# ---------------------------------------------------------------------------- stacks


class Tenants:
    def __init__(self, path: Path, keys: dict[str, str]) -> None:
        self.path = path
        self.keys = keys

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}


@pytest.fixture(scope="module")
def stream_tenants(run_dir: Path) -> Tenants:
    keys = {name: "osk_" + secrets.token_urlsafe(24) for name in ("acme", "globex", "one")}
    limits = {"one": {"max_streams": 1}}
    doc = {
        "tenants": [
            {"name": n, "api_key_sha256": [hashlib.sha256(k.encode()).hexdigest()], **limits.get(n, {})}
            for n, k in keys.items()
        ]
    }
    path = run_dir / "stream-tenants.json"
    path.write_text(json.dumps(doc))
    return Tenants(path, keys)


def _stack(
    run_dir: Path, redis_url: str, triton: Triton, tenants: Tenants, name: str, idle_s: float, **worker: Any
) -> Iterator[ApiServer]:
    prefix = f"t-{name}-" + secrets.token_hex(3)
    env = worker_env(redis_url, triton, prefix, tenants_file=tenants.path, **worker)
    proc = python_process("worker", "workers", run_dir, env, log_name=f"worker-{prefix}").start()
    api = start_api(run_dir, redis_url, prefix, tenants.path, OVERSPILL_STREAM_IDLE_TIMEOUT_S=str(idle_s))
    yield ApiServer(api_url(api), prefix, api, proc)
    api.stop()
    proc.stop()


@pytest.fixture(scope="module")
def local_stack(
    redis_url: str, triton: Triton, run_dir: Path, stream_tenants: Tenants
) -> Iterator[ApiServer]:
    yield from _stack(run_dir, redis_url, triton, stream_tenants, "slocal", 30)


@pytest.fixture(scope="module")
def remote_stack(
    redis_url: str, triton: Triton, run_dir: Path, stream_tenants: Tenants, fake_remote_server: FakeRemote
) -> Iterator[ApiServer]:
    yield from _stack(
        run_dir,
        redis_url,
        triton,
        stream_tenants,
        "sremote",
        IDLE_S,
        gateway_mode="remote",
        remote_base_url=fake_remote_server.base_url,
        remote_max_retries=1,
        remote_backoff_s=0.05,
        remote_circuit_failures=1000,
    )


@pytest.fixture
def remote(fake_remote_server: FakeRemote) -> Iterator[FakeRemote]:
    fake_remote_server.reset()
    yield fake_remote_server
    fake_remote_server.reset()


def sdk(stack: ApiServer, tenants: Tenants, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.url}/v1", api_key=tenants.keys[tenant], max_retries=0, timeout=60
    )


def sync_sdk(stack: ApiServer, tenants: Tenants) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=tenants.keys["acme"], max_retries=0, timeout=60)


def chat(content: str, max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    return {
        "model": CHAT_MODEL,
        "messages": [SYSTEM, {"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


@pytest.fixture
async def stack_client(redis_url: str) -> AsyncIterator[Any]:
    clients: list[Client] = []

    def make(stack: ApiServer) -> Client:
        c = Client(redis_url, prefix=stack.prefix)
        clients.append(c)
        return c

    yield make
    for c in clients:
        await c.aclose()


async def sse_events(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """Every event of an SSE response, parsed (id, event, data)."""
    events: list[dict[str, Any]] = []
    async with http.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        current: dict[str, Any] = {}
        async for line in response.aiter_lines():
            if not line:
                if current:
                    events.append(current)
                current = {}
            elif ":" in line:
                field, _, value = line.partition(":")
                current[field] = json.loads(value.strip()) if field == "data" else value.strip()
    return events


async def job_status(client: Client, job_id: str, timeout: float = 30.0) -> Any:
    return await client.wait(job_id, timeout)


# ---------------------------------------------------------------------------- contract


class TestContract:
    def test_stream_with_n_is_a_400(self) -> None:
        from producer.contract import InvalidBody, parse_body

        with pytest.raises(InvalidBody) as exc:
            parse_body(JobKind.chat, chat("hi", stream=True, n=2))
        assert exc.value.param == "n" and "stream" in str(exc.value)
        with pytest.raises(InvalidBody):
            parse_body(JobKind.chat, chat("hi", stream_options={"include_usage": True}))

    def test_a_batch_line_with_stream_fails_alone_as_a_400(self, tmp_path: Path) -> None:
        lines = [
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": chat("x", stream=True),
            },
            {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": chat("y")},
        ]
        path = tmp_path / "in.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        prepared, _ = read_chunk(path, 0, 10, JobKind.chat, Limits())
        assert prepared[0].error is not None and prepared[0].error["param"] == "stream"
        assert prepared[1].error is None
        ok, line = output_line("batch_1", 0, Entry("a", None, prepared[0].error), None, None, "completed")
        response = json.loads(line)["response"]
        assert not ok and response["status_code"] == 400
        assert "stream is not supported" in response["body"]["error"]["message"]


# ---------------------------------------------------------------------------- the SDK


class TestSdk:
    async def test_local_stream_equals_the_unstreamed_completion(
        self, local_stack: ApiServer, stream_tenants: Tenants
    ) -> None:
        body = chat("Name three colours.", max_tokens=24)
        async with sdk(local_stack, stream_tenants) as client:
            plain = await client.chat.completions.create(**body)
            stream = await client.chat.completions.create(**body, stream=True)
            chunks = [c async for c in stream]
        assert chunks[0].object == "chat.completion.chunk"
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text and text == plain.choices[0].message.content
        assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
        assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1

        def sync_run() -> str:
            with sync_sdk(local_stack, stream_tenants) as client:
                with client.chat.completions.create(**body, stream=True) as s:
                    return "".join(c.choices[0].delta.content or "" for c in s if c.choices)

        assert await asyncio.to_thread(sync_run) == plain.choices[0].message.content

    async def test_include_usage_adds_the_usage_chunk(
        self, local_stack: ApiServer, stream_tenants: Tenants
    ) -> None:
        async with sdk(local_stack, stream_tenants) as client:
            stream = await client.chat.completions.create(
                **chat("Say hi."), stream=True, stream_options={"include_usage": True}
            )
            chunks = [c async for c in stream]
            plain = await client.chat.completions.create(**chat("Say hi."))
        last = chunks[-1]
        assert last.choices == [] and last.usage is not None
        assert last.usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]
        assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
        assert all(c.usage is None for c in chunks[:-1])

    async def test_remote_stream_equals_the_unstreamed_completion(
        self, remote_stack: ApiServer, stream_tenants: Tenants, remote: FakeRemote
    ) -> None:
        body = chat("one two three four five six", max_tokens=32)
        async with sdk(remote_stack, stream_tenants) as client:
            plain = await client.chat.completions.create(**body)
            stream = await client.chat.completions.create(
                **body, stream=True, stream_options={"include_usage": True}
            )
            chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == plain.choices[0].message.content == "echo: one two three four five six"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
        streamed = [r for r in remote.requests("/v1/chat/completions") if (r["body"] or {}).get("stream")]
        assert len(streamed) == 1, "the streamed job went to the remote as a stream"

    async def test_n_above_one_with_stream_is_a_400(
        self, local_stack: ApiServer, stream_tenants: Tenants
    ) -> None:
        async with sdk(local_stack, stream_tenants) as client:
            with pytest.raises(openai.BadRequestError) as exc:
                await client.chat.completions.create(**chat("hi"), stream=True, n=2)
        assert isinstance(exc.value.body, dict) and exc.value.body["param"] == "n"


# ---------------------------------------------------------------------------- job events


class TestJobEvents:
    async def test_a_late_reader_gets_every_token_in_order(
        self, local_stack: ApiServer, stack_client: Any, redis_url: str
    ) -> None:
        client: Client = stack_client(local_stack)
        job = await client.submit("chat", chat("Count from one to ten.", max_tokens=32), stream=True)
        result = await client.wait(job, 60)
        assert result.status == "succeeded"
        events = [e async for e in client.stream(job)]
        kinds = [e.event for e in events]
        assert kinds[0] == "status" and events[0].data["status"] == "queued"
        assert events[1].data["status"] == "running"
        assert events[-1].terminal and events[-1].data["status"] == "succeeded"
        assert events[-1].data["body"] == result.body, "the terminal event carries the envelope"
        text = "".join(e.text for e in events)
        assert text == result.body["choices"][0]["message"]["content"]  # type: ignore[index]
        ids = [tuple(map(int, e.id.split("-"))) for e in events if e.id]
        assert ids == sorted(ids) and len(ids) == len(events)
        assert sum(1 for e in events if e.terminal) == 1

        def read_sync() -> list[StreamEvent]:
            with SyncClient(redis_url, prefix=local_stack.prefix) as sync:
                return list(sync.stream(job))

        assert await asyncio.to_thread(read_sync) == events

    async def test_last_event_id_resumes_and_tenants_are_isolated(
        self, local_stack: ApiServer, stream_tenants: Tenants, stack_client: Any
    ) -> None:
        client: Client = stack_client(local_stack)
        async with httpx.AsyncClient(base_url=local_stack.url, timeout=30) as http:
            submitted = await http.post(
                "/v1/jobs",
                json={
                    "kind": "chat",
                    "body": chat("Name a fruit.", max_tokens=12),
                    "options": {"stream": True},
                },
                headers=stream_tenants.headers("acme"),
            )
            assert submitted.status_code == 202, submitted.text
            job = submitted.json()["id"]
            path = f"/v1/jobs/{job}/events"
            everything = await sse_events(http, path, stream_tenants.headers("acme"))
            assert everything[-1]["event"] == "status" and everything[-1]["data"]["status"] == "succeeded"
            cut = everything[2]["id"]
            rest = await sse_events(http, path, {**stream_tenants.headers("acme"), "Last-Event-ID": cut})
            other = await http.get(path, headers=stream_tenants.headers("globex"))
            bad = await http.get(path, headers={**stream_tenants.headers("acme"), "Last-Event-ID": "x:y"})
            embed = {"model": "all-MiniLM-L6-v2", "input": "x"}
            not_chat = await http.post(
                "/v1/jobs",
                json={"kind": "embed", "body": embed, "options": {"stream": True}},
                headers=stream_tenants.headers("acme"),
            )
        assert not_chat.status_code == 400 and not_chat.json()["error"]["param"] == "options.stream"
        assert rest == everything[3:]
        assert other.status_code == 404 and other.json()["error"]["type"] == "not_found_error"
        assert bad.status_code == 400
        result = await client.get(job)
        text = "".join(e["data"].get("text", "") for e in everything if e["event"] == "delta")
        assert text == result.body["choices"][0]["message"]["content"]  # type: ignore[index]


# ---------------------------------------------------------------------------- cancel and limits


async def first_content(response: httpx.Response) -> str:
    async for line in response.aiter_lines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                return str(chunk["id"])
    raise AssertionError("the stream ended without content")


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
