"""Streamed chat through the queue, against the real API, workers, Triton and the fake remote:
the real ``openai`` SDK's streaming (sync and async), and job events over SSE with resume and
tenant isolation. Disconnects, limits, remote failures and kills: test_streaming_faults.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from producer import Client, SyncClient
from producer.batches.lines import Entry, output_line, read_chunk
from producer.contract import JobKind, Limits, StreamEvent
from tests.fixtures_api import ApiServer
from tests.fixtures_remote import FakeRemote
from tests.fixtures_streaming import (
    Tenants,
    chat,
    sdk,
    sse_events,
    sync_sdk,
)

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
