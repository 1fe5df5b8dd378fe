"""The remote backend against the fake remote, a real HTTP server in its own process.

Retries, Retry-After, 4xx, garbage bodies, timeouts, key rotation through a secret file and
key redaction, and parity of the bodies with the local ones.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from producer.contract import JobKind, WorkItem, parse_body, unpack_body
from stack.processes import free_port
from workers.backends.local import TritonBackend
from workers.backends.remote import RemoteBackend, RemoteConfig, RemoteHandlers
from workers.core import RemoteBadResponse, RemoteRejected, RemoteUnavailable, WorkerConfig, retry_after_s

from .conftest import Triton
from .fixtures_remote import FakeRemote


def remote_config(base_url: str, **overrides: Any) -> RemoteConfig:
    settings: dict[str, Any] = {
        "base_url": base_url,
        "api_key": "sk-test-env",
        "same_models": {"fixed-cost"},
        "backoff_s": 0.05,
        "backoff_max_s": 0.2,
        "max_retries": 2,
        "timeout_s": 5.0,
    }
    settings.update(overrides)
    return RemoteConfig(**settings)


def item(kind: str, body: dict[str, Any], deadline_s: float = 60.0) -> WorkItem:
    now = time.time()
    return WorkItem(
        id="job_" + os.urandom(6).hex(),
        kind=JobKind(kind),
        body=body,
        created_at=now,
        deadline_at=now + deadline_s,
    )


async def run_remote(config: RemoteConfig, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    worker_config = WorkerConfig()
    handlers = RemoteHandlers(worker_config, config, RemoteBackend(config))
    try:
        job = item(kind, body)
        spec = worker_config.model_for(JobKind(kind), body["model"])
        assert spec is not None
        answer = await handlers.run(job, parse_body(kind, body), spec)
        return answer.body
    finally:
        await handlers.aclose()


EMBED = {"model": "fixed-cost", "input": ["the quick brown fox", "jumps over the lazy dog"]}


class TestBodies:
    async def test_embeddings_are_the_local_models_own_vectors(
        self, fake_remote: FakeRemote, triton: Triton
    ) -> None:
        """The fake serves fixed-cost identically, so spilled vectors equal Triton's."""
        body = unpack_body(await run_remote(remote_config(fake_remote.base_url), "embed", EMBED))  # as read
        local = TritonBackend(triton.grpc_url)
        try:
            expected = await local.embed("fixed_cost", EMBED["input"])
        finally:
            await local.aclose()
        assert body["object"] == "list" and body["model"] == "fixed-cost"
        assert [d["index"] for d in body["data"]] == [0, 1]
        for datum, want in zip(body["data"], expected, strict=True):
            assert not isinstance(want, Exception)
            assert datum["embedding"] == pytest.approx(want[0], abs=1e-6)
        assert body["usage"] == {
            "prompt_tokens": sum(t for _, t in expected),
            "total_tokens": sum(t for _, t in expected),
        }
        (request,) = fake_remote.requests("/v1/embeddings")
        assert request["model"] == "fixed-cost" and request["key"] == "sk-test-env"

    async def test_rerank_and_chat_have_the_local_shapes_and_mapped_models(
        self, fake_remote: FakeRemote
    ) -> None:
        config = remote_config(
            fake_remote.base_url,
            model_map={
                "minilm-l6-cosine-rerank": "rerank-english-v3.0",
                "SmolLM2-135M-Instruct": "gpt-4o-mini",
            },
        )
        rerank = await run_remote(
            config,
            "rerank",
            {
                "model": "rerank",
                "query": "red apples",
                "documents": ["blue sky", "red apples here", "apples"],
                "top_n": 2,
                "return_documents": True,
            },
        )
        assert set(rerank) == {"id", "model", "results", "usage", "meta"}
        assert rerank["model"] == "rerank-english-v3.0"
        assert [r["index"] for r in rerank["results"]] == [1, 2]
        assert rerank["results"][0]["document"] == {"text": "red apples here"}

        chat = await run_remote(
            config,
            "chat",
            {"model": "chat", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3},
        )
        assert set(chat) == {"id", "object", "created", "model", "choices", "usage"}
        assert chat["id"].startswith("chatcmpl-") and chat["model"] == "gpt-4o-mini"
        assert chat["choices"][0]["message"] == {"role": "assistant", "content": "echo: hello there"}
        assert (
            chat["usage"]["total_tokens"]
            == chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"]
        )
        sent = fake_remote.requests("/v1/chat/completions")[0]["body"]
        assert sent["model"] == "gpt-4o-mini" and sent["max_tokens"] == 3

    async def test_only_allowed_fields_reach_the_remote(self, fake_remote: FakeRemote) -> None:
        """Fields that cost money or keep data at the remote are never forwarded."""
        extra = {
            "store": True,
            "service_tier": "priority",
            "metadata": {"a": "b"},
            "user": "u1",
        }
        chat = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], **extra}
        await run_remote(remote_config(fake_remote.base_url), "chat", {**chat, "temperature": 0.5})
        await run_remote(remote_config(fake_remote.base_url), "embed", {**EMBED, **extra})
        sent_chat = fake_remote.requests("/v1/chat/completions")[0]["body"]
        sent_embed = fake_remote.requests("/v1/embeddings")[0]["body"]
        assert set(sent_chat) == {"model", "messages", "max_tokens", "temperature"}
        assert set(sent_embed) == {"model", "input", "encoding_format"}

    def test_embeddings_spill_only_to_the_same_model_and_rerank_only_where_served(self) -> None:
        config = RemoteConfig(base_url="http://127.0.0.1:1/v1", same_models={"fixed-cost"})
        worker = WorkerConfig()
        served = {s.name: config.serves(s) for s in worker.models}
        assert served == {
            "all-MiniLM-L6-v2": False,
            "fixed-cost": True,
            "minilm-l6-cosine-rerank": False,  # OpenAI has no /v1/rerank: not unless listed
            "SmolLM2-135M-Instruct": True,
        }
        with_rerank = RemoteConfig(base_url="http://127.0.0.1:1/v1", kinds={"chat", "embed", "rerank"})
        assert [s.name for s in worker.models if s.kind == "rerank" and with_rerank.serves(s)] == [
            "minilm-l6-cosine-rerank"
        ]
        assert not RemoteConfig(base_url="").serves(worker.models[1])


class TestRetries:
    async def test_5xx_is_retried_then_succeeds(self, fake_remote: FakeRemote) -> None:
        fake_remote.control(mode="503", count=2)
        body = await run_remote(remote_config(fake_remote.base_url), "embed", EMBED)
        assert len(body["data"]) == 2
        assert [r["status"] for r in fake_remote.requests()] == [503, 503, 200]

    async def test_persistent_5xx_gives_up_after_max_retries(self, fake_remote: FakeRemote) -> None:
        fake_remote.control(mode="500")
        with pytest.raises(RemoteUnavailable, match="failed after 3 tries: 500"):
            await run_remote(remote_config(fake_remote.base_url), "embed", EMBED)
        assert len(fake_remote.requests()) == 3

    async def test_429_waits_retry_after_seconds(self, fake_remote: FakeRemote) -> None:
        fake_remote.control(mode="429", count=1, retry_after="1")
        started = time.monotonic()
        await run_remote(remote_config(fake_remote.base_url), "embed", EMBED)
        assert time.monotonic() - started >= 0.9
        assert [r["status"] for r in fake_remote.requests()] == [429, 200]

    async def test_429_http_date_is_capped(self, fake_remote: FakeRemote) -> None:
        in_an_hour = email.utils.formatdate(time.time() + 3600, usegmt=True)
        fake_remote.control(mode="429", count=1, retry_after=in_an_hour)
        started = time.monotonic()
        await run_remote(remote_config(fake_remote.base_url, retry_after_max_s=0.3), "embed", EMBED)
        assert 0.25 <= time.monotonic() - started < 3.0

    async def test_4xx_fails_at_once_with_the_remotes_message(self, fake_remote: FakeRemote) -> None:
        fake_remote.control(mode="400")
        with pytest.raises(RemoteRejected, match="maximum context length"):
            await run_remote(remote_config(fake_remote.base_url), "embed", EMBED)
        assert len(fake_remote.requests()) == 1

    @pytest.mark.parametrize("mode", ["garbage", "truncated"])
    async def test_bad_bodies_are_errors_not_crashes(self, fake_remote: FakeRemote, mode: str) -> None:
        fake_remote.control(mode=mode)
        with pytest.raises(RemoteBadResponse, match="not JSON"):
            await run_remote(remote_config(fake_remote.base_url), "embed", EMBED)
        assert len(fake_remote.requests()) == 3

    async def test_an_empty_chat_answer_is_a_bad_response_never_a_success(
        self, fake_remote: FakeRemote
    ) -> None:
        """A well-formed 200 whose message is empty (a caching proxy with a bug sent it for every
        request) fails like a 5xx, so the job fails over instead of "succeeding"."""
        fake_remote.control(mode="empty")
        chat = {"model": "chat", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}
        with pytest.raises(RemoteBadResponse, match="empty message"):
            await run_remote(remote_config(fake_remote.base_url), "chat", chat)
        backend = RemoteBackend(remote_config(fake_remote.base_url))
        try:
            with pytest.raises(RemoteBadResponse, match="streamed an empty message"):
                async for _ in backend.chat_stream("chat", json.dumps(chat["messages"]), '{"max_tokens": 3}'):
                    pass
        finally:
            await backend.aclose()
        fake_remote.control(mode="ok")
        answer = await run_remote(remote_config(fake_remote.base_url), "chat", chat)
        assert answer["choices"][0]["message"]["content"] == "echo: hello there"

    async def test_a_remote_trusted_with_empty_answers_passes_them_on_counted(
        self, fake_remote: FakeRemote
    ) -> None:
        """``empty_reply_is_fault: false`` (a remote whose empty answers are real ones): the
        empty message is the job's answer, and it is still counted."""
        fake_remote.control(mode="empty")
        chat = {"model": "chat", "messages": [{"role": "user", "content": "say nothing"}], "max_tokens": 3}
        before = REGISTRY.get_sample_value("overspill_remote_empty_replies_total", {"mode": "plain"}) or 0.0
        config = remote_config(fake_remote.base_url, empty_reply_is_fault=False)
        answer = await run_remote(config, "chat", chat)
        assert answer["choices"][0]["message"]["content"] == ""
        assert (
            REGISTRY.get_sample_value("overspill_remote_empty_replies_total", {"mode": "plain"}) == before + 1
        )
        fake_remote.control(mode="ok")

    async def test_timeouts_are_retried_then_unavailable(self, fake_remote: FakeRemote) -> None:
        fake_remote.control(mode="timeout")
        started = time.monotonic()
        with pytest.raises(RemoteUnavailable, match="timeout"):
            await run_remote(
                remote_config(fake_remote.base_url, timeout_s=0.3, max_retries=1), "embed", EMBED
            )
        assert time.monotonic() - started < 3.0
        assert len(fake_remote.requests()) == 2

    async def test_unreachable_remote_is_unavailable(self) -> None:
        url = f"http://127.0.0.1:{free_port()}/v1"
        with pytest.raises(RemoteUnavailable, match="unreachable"):
            await run_remote(remote_config(url, max_retries=1), "embed", EMBED)

    def test_retry_after_parsing(self) -> None:
        now = time.time()
        assert retry_after_s("2", 10) == 2.0
        assert retry_after_s("120", 10) == 10.0
        assert retry_after_s(email.utils.formatdate(now + 5, usegmt=True), 10, now=now) == pytest.approx(
            5, abs=1
        )
        assert retry_after_s(email.utils.formatdate(now - 5, usegmt=True), 10, now=now) == 0.0
        assert retry_after_s("soon", 10) is None
        assert retry_after_s(None, 10) is None


class TestApiKey:
    async def test_rotated_secret_file_is_used_without_restart(
        self, fake_remote: FakeRemote, tmp_path: Path
    ) -> None:
        secret = tmp_path / "api-key"
        secret.write_text("sk-old-key\n")
        config = remote_config(fake_remote.base_url, api_key_file=secret)
        worker_config = WorkerConfig()
        spec = worker_config.model_for(JobKind.embed, "fixed-cost")
        assert spec is not None
        handlers = RemoteHandlers(worker_config, config, RemoteBackend(config))
        try:
            await handlers.run(item("embed", EMBED), parse_body("embed", EMBED), spec)
            secret.write_text("sk-new-key-rotated\n")
            await handlers.run(item("embed", EMBED), parse_body("embed", EMBED), spec)
        finally:
            await handlers.aclose()
        assert [r["key"] for r in fake_remote.requests()] == ["sk-old-key", "sk-new-key-rotated"]

    async def test_the_key_never_appears_in_errors(self, fake_remote: FakeRemote) -> None:
        """The fake, like OpenAI, echoes a wrong key in its 401 message: it must be redacted."""
        fake_remote.control(api_keys=["sk-the-right-one"])
        with pytest.raises(RemoteRejected) as caught:
            await run_remote(remote_config(fake_remote.base_url, api_key="sk-wrong-secret"), "embed", EMBED)
        assert "401" in caught.value.message and "Incorrect API key" in caught.value.message
        assert "sk-wrong-secret" not in caught.value.message and "sk-wrong-secret" not in str(caught.value)
        assert "sk-wrong-secret" not in repr(remote_config(fake_remote.base_url, api_key="sk-wrong-secret"))


class TestConnections:
    def test_the_connections_are_split_into_small_clients_of_at_most_four(self) -> None:
        from workers.core.shards import ShardedClient

        made: list[int] = []

        def make(n: int) -> httpx.AsyncClient:
            made.append(n)
            return httpx.AsyncClient()

        for connections, sizes in [(64, [4] * 16), (10, [4, 4, 2]), (3, [3]), (1, [1])]:
            made.clear()
            ShardedClient(make, connections)
            assert made == sizes, connections

    async def test_each_request_goes_to_the_shard_with_the_most_room(self) -> None:
        from workers.core.shards import ShardedClient

        shards = ShardedClient(lambda n: httpx.AsyncClient(), 10)  # shards of 4, 4 and 2
        held = [shards.lease() for _ in range(10)]
        clients = [await lease.__aenter__() for lease in held]
        try:
            counts = [clients.count(c) for c in shards._clients]
            assert counts == [4, 4, 2]  # ten in flight: every connection of every shard in use
        finally:
            for lease in held:
                await lease.__aexit__(None, None, None)
            await shards.aclose()
        assert shards._busy == [0, 0, 0]

    async def test_many_concurrent_requests_share_the_shards_and_all_succeed(
        self, fake_remote: FakeRemote
    ) -> None:
        fake_remote.control(latency_ms=50)
        backend = RemoteBackend(remote_config(fake_remote.base_url, max_concurrency=32, max_connections=16))
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        try:
            started = time.monotonic()
            answers = await asyncio.gather(*(backend.post("chat/completions", body) for _ in range(64)))
            took = time.monotonic() - started
        finally:
            await backend.aclose()
        assert all(a["choices"][0]["message"]["content"] == "echo: hi" for a in answers)
        assert len(fake_remote.requests()) == 64
        assert took < 2.0  # 16 connections at 50 ms each: about 0.2 s, far from one at a time (3.2 s)
