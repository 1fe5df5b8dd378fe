"""Capability routing: a chat request needing what the local model lacks runs on a remote that
offers it, with its fields passed through exactly, or is refused naming the field.

A real worker serving SmolLM2 locally, with two remotes in its providers file: ``plain`` first
(it offers text only) and ``tools`` second (it offers everything); the real API in front; the
fake remote over HTTP behind both; the ``openai`` SDK as the caller.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from producer.client import Client
from producer.contract import Capability, Offers, lacking, needs, parse_body, refusal
from stack.processes import python_process
from workers.core.settings import DEFAULT_MODELS

from .conftest import Triton, worker_env
from .fixtures_api import TenantKeys, api_url, start_api
from .fixtures_remote import FakeRemote

CHAT = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": CHAT, "messages": [{"role": "user", "content": text}], "max_tokens": 32, **extra}


class TestWhatARequestNeeds:
    def test_tools_a_tool_history_json_and_logprobs_each_name_their_field(self) -> None:
        assert needs(ask("hi")) == {}
        assert needs(ask("hi", tools=[WEATHER])) == {Capability.tools: "tools"}
        assert needs(ask("hi", tool_choice="none")) == {}
        history = {
            "model": CHAT,
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
        }
        assert needs(history) == {Capability.tools: "messages.1"}
        assert needs(ask("hi", response_format={"type": "json_object"})) == {
            Capability.response_format: "response_format"
        }
        assert needs(ask("hi", response_format={"type": "text"})) == {}
        assert needs(ask("hi", top_logprobs=2)) == {Capability.logprobs: "top_logprobs"}

    def test_a_conversation_longer_than_the_context_needs_a_longer_one(self) -> None:
        local = Offers(context_tokens=2048)
        assert lacking(ask("word " * 100), local) == {}
        assert lacking(ask("x" * 7000), local) == {Capability.context: "messages"}
        assert lacking(ask("x" * 7000), Offers()) == {}  # no known limit

    def test_one_rule_refuses_what_no_place_the_job_may_run_offers(self) -> None:
        local, everything = (
            Offers(context_tokens=2048),
            Offers(features={Capability.tools, Capability.logprobs}),
        )
        body = ask("hi", tools=[WEATHER])
        assert refusal(body, CHAT, local, everything, stays_local=False) is None
        assert refusal(body, CHAT, local, everything, stays_local=True) == (
            f"tools: model '{CHAT}' offers no tool calls locally, and this job may not leave "
            "(local_only or route 'local')",
            "tools",
        )
        assert refusal(body, CHAT, local, None, stays_local=False) == (
            f"tools: model '{CHAT}' offers no tool calls locally or on any remote",
            "tools",
        )
        json_body = ask("hi", response_format={"type": "json_object"})
        assert refusal(json_body, "gpt", None, everything, stays_local=False) == (
            "response_format: model 'gpt' offers no response_format on any remote",
            "response_format",
        )
        assert refusal(ask("hi"), CHAT, local, None, stays_local=True) is None

    def test_such_requests_are_valid_but_not_streamed(self) -> None:
        parse_body("chat", ask("hi", tools=[WEATHER], tool_choice="auto"))
        with pytest.raises(ValueError, match="tools .tools. is answered unstreamed: send stream false"):
            parse_body("chat", ask("hi", tools=[WEATHER], stream=True))
        with pytest.raises(ValueError, match="tool_call_id is required"):
            parse_body("chat", {"model": CHAT, "messages": [{"role": "tool", "content": "42"}]})


@pytest.fixture(scope="module")
def remotes_file(tmp_path_factory: pytest.TempPathFactory, fake_remote_server: FakeRemote) -> Path:
    entry = {"base_url": fake_remote_server.base_url, "max_retries": 0, "timeout_s": 5}
    remotes = [
        {**entry, "name": "plain", "models": {CHAT: "plain-chat"}, "offers": {"features": []}},
        {**entry, "name": "tools", "models": {CHAT: "gpt-4.1-mini"}},
    ]
    path = tmp_path_factory.mktemp("capability") / "providers.json"
    path.write_text(json.dumps({"remotes": remotes}))
    return path


@pytest.fixture(scope="module")
def capable(
    redis_url: str, triton: Triton, run_dir: Path, tenants: TenantKeys, remotes_file: Path
) -> Iterator[tuple[str, str]]:
    """(API URL, prefix): a worker with the two remotes, in hybrid mode, and its API."""
    prefix = "t-cap-" + secrets.token_hex(3)
    models = json.dumps([m.model_dump(mode="json") for m in DEFAULT_MODELS])
    env = worker_env(redis_url, triton, prefix, models=models, providers_file=str(remotes_file))
    worker = python_process("worker", "workers", run_dir, env, log_name=f"worker-{prefix}").start()
    api = start_api(run_dir, redis_url, prefix, tenants.path)
    yield api_url(api), prefix
    api.stop()
    worker.stop()


@pytest.fixture
async def sdk(capable: tuple[str, str], tenants: TenantKeys) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{capable[0]}/v1", api_key=tenants.keys["acme"], max_retries=0, timeout=60
    ) as client:
        yield client


async def test_tools_round_trip_through_the_sdk_on_the_remote_that_offers_them(
    sdk: openai.AsyncOpenAI, fake_remote: FakeRemote
) -> None:
    messages: list[Any] = [{"role": "user", "content": "weather in Oslo?"}]
    first = await sdk.chat.completions.create(model=CHAT, messages=messages, tools=[WEATHER], max_tokens=32)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"input": "weather in Oslo?"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = await sdk.chat.completions.create(model=CHAT, messages=messages, tools=[WEATHER], max_tokens=32)
    assert second.choices[0].message.content == "tool said: sunny"
    sent = fake_remote.requests("/v1/chat/completions")
    assert [r["model"] for r in sent] == ["gpt-4.1-mini", "gpt-4.1-mini"]  # never the text-only remote
    assert sent[0]["body"]["tools"] == [WEATHER]  # exactly as the caller sent them
    assert sent[1]["body"]["messages"][1]["tool_calls"][0]["id"] == call.id
    assert sent[1]["body"]["messages"][2] == {"role": "tool", "tool_call_id": call.id, "content": "sunny"}


async def test_the_job_says_it_ran_remotely_for_a_capability(
    capable: tuple[str, str], tenants: TenantKeys, fake_remote: FakeRemote
) -> None:
    body = ask("a json please", response_format={"type": "json_object"}, logprobs=True, top_logprobs=1)
    async with httpx.AsyncClient(base_url=capable[0], headers=tenants.headers("acme"), timeout=30) as http:
        accepted = await http.post("/v1/jobs", json={"kind": "chat", "body": body})
        assert accepted.status_code == 202, accepted.text
        job = await http.get(f"/v1/jobs/{accepted.json()['id']}", params={"wait": 20})
    record = job.json()
    assert (record["status"], record["route"], record["route_reason"]) == (
        "succeeded",
        "remote",
        "capability",
    )
    choice = record["body"]["choices"][0]
    assert json.loads(choice["message"]["content"]) == {"echo": "a json please"}
    assert [e["token"] for e in choice["logprobs"]["content"]] == choice["message"]["content"].split()
    assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 1
    (sent,) = fake_remote.requests("/v1/chat/completions")
    assert {k: sent["body"][k] for k in ("response_format", "logprobs", "top_logprobs")} == {
        "response_format": {"type": "json_object"},
        "logprobs": True,
        "top_logprobs": 1,
    }


async def test_a_plain_request_still_runs_locally(sdk: openai.AsyncOpenAI, fake_remote: FakeRemote) -> None:
    reply = await sdk.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert reply.choices[0].message.content
    assert fake_remote.requests("/v1/chat/completions") == []


async def test_a_local_only_job_needing_tools_is_refused_naming_the_field(
    capable: tuple[str, str], tenants: TenantKeys, fake_remote: FakeRemote
) -> None:
    job = {"kind": "chat", "body": ask("hi", tools=[WEATHER]), "options": {"local_only": True}}
    async with httpx.AsyncClient(base_url=capable[0], headers=tenants.headers("acme"), timeout=30) as http:
        refused = await http.post("/v1/jobs", json=job)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("tools", "model_lacks_capability")
    assert "may not leave" in error["message"]
    assert fake_remote.requests() == []


async def test_a_worker_fails_such_a_job_queued_past_the_api(
    capable: tuple[str, str], redis_url: str, fake_remote: FakeRemote
) -> None:
    async with Client(redis_url, prefix=capable[1]) as client:
        job_id = await client.submit("chat", ask("hi", logprobs=True), local_only=True)
        result = await client.wait(job_id, 30)
    assert result.status == "failed" and result.error is not None
    assert result.error.type == "invalid_request"
    assert result.error.message.startswith(
        "logprobs: model 'SmolLM2-135M-Instruct' offers no logprobs locally"
    )
    assert fake_remote.requests() == []


async def test_a_conversation_too_long_for_the_local_context_goes_remote_even_streamed(
    sdk: openai.AsyncOpenAI, fake_remote: FakeRemote
) -> None:
    long = "lorem " * 1500  # 9 000 characters: about 3 000 tokens judged, past SmolLM2's 2 048
    stream = await sdk.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": long}], max_tokens=3, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "echo: lorem lorem"
    (sent,) = fake_remote.requests("/v1/chat/completions")
    assert sent["model"] == "plain-chat"  # context alone: the text-only remote offers no less of it


async def test_the_catalogue_and_the_openapi_document_state_the_offers(
    capable: tuple[str, str], tenants: TenantKeys
) -> None:
    async with httpx.AsyncClient(base_url=capable[0], timeout=30) as http:
        models = (await http.get("/v1/models", headers=tenants.headers("acme"))).json()["data"]
        document = (await http.get("/openapi.json")).json()
    (card,) = [m for m in models if m["id"] == CHAT]
    assert card["offers"]["local"] == {"features": [], "context_tokens": 2048}
    assert set(card["offers"]["remote"]["features"]) == {"tools", "response_format", "logprobs"}
    tools = document["components"]["schemas"]["ChatRequest"]["properties"]["tools"]
    assert "maxItems" not in json.dumps(tools)  # offered here: not documented as refused
