"""The decoupled ``chat`` model on the real Triton: streamed deltas and continuous batching.

Each conversation is its own gRPC stream (``TritonBackend.chat_stream``); the model decodes
every running conversation together, admits new ones between decode steps and lets finished or
cancelled ones go at once (n_seq_max = 8 slots in model_repository/chat/config.pbtxt).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stack.processes import MODEL_REPOSITORY, free_port
from tests.conftest import Triton
from workers.backends import ChatDelta, ChatOutput
from workers.backends.local import TritonBackend
from workers.core import CircuitState, ModelError

SLOTS = 8


def conversation(question: str) -> str:
    return json.dumps([{"role": "system", "content": "You are a concise assistant."},
                       {"role": "user", "content": question}])  # fmt: skip


def params(max_tokens: int, **extra: Any) -> str:
    return json.dumps({"max_tokens": max_tokens, "temperature": 0, **extra})


@pytest.fixture
async def backend(triton: Triton) -> AsyncIterator[TritonBackend]:
    b = TritonBackend(triton.grpc_url)
    yield b
    await b.aclose()


async def stream(backend: TritonBackend, question: str, max_tokens: int, **extra: Any) -> list[ChatDelta]:
    return [d async for d in backend.chat_stream("chat", conversation(question), params(max_tokens, **extra))]


def model_metric(triton: Triton, name: str) -> float:
    with urllib.request.urlopen(triton.metrics_url, timeout=2) as r:  # noqa: S310  # loopback
        for line in r.read().decode().splitlines():
            if line.startswith(name + '{model="chat"}'):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"the chat model reports no {name} metric")


def busy_slots(triton: Triton) -> float:
    return model_metric(triton, "chat_busy_slots")


def held_back() -> Any:
    path = MODEL_REPOSITORY / "chat" / "1" / "smollm.py"
    spec = importlib.util.spec_from_file_location("smollm_under_test", Path(path))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module._held_back


def test_a_delta_holds_back_incomplete_utf8_and_a_possible_stop_string_prefix() -> None:
    hold = held_back()
    assert hold("Hello wor", ["world"]) == 3  # "wor" may become "world"
    assert hold("Hello", ["world"]) == 0
    assert hold("Hello \ufffd", []) == 1  # the first bytes of a multi-byte character
    assert hold("ab\ufffd", ["b\u00e9"]) == 2
    assert hold("stop here", ["here", "e"]) == 0  # a whole stop string is cut, not held


async def test_streamed_deltas_concatenate_to_the_unstreamed_text(backend: TritonBackend) -> None:
    questions = ["Describe the sea in two sentences.", "Reply with three emoji and the word 日本語."]
    streamed = [stream(backend, q, 48) for q in questions]
    unstreamed = backend.chat("chat", [(conversation(q), params(48)) for q in questions])
    *all_deltas, outputs = await asyncio.gather(*streamed, unstreamed)  # batch-mates, too
    for deltas, output in zip(all_deltas, outputs, strict=True):
        assert isinstance(output, ChatOutput)
        assert "".join(d.text for d in deltas) == output.text
        assert len(deltas) > 5, "text arrives token by token, not at the end"
        assert all(d.finish_reason is None for d in deltas[:-1]) and all(d.text for d in deltas[:-1])
        last = deltas[-1]
        assert last.finish_reason == output.finish_reason in ("stop", "length")
        assert (last.prompt_tokens, last.completion_tokens) == (
            output.prompt_tokens,
            output.completion_tokens,
        )
        if "\ufffd" not in output.text:
            assert not any("\ufffd" in d.text for d in deltas), "no delta splits a character"


async def test_a_short_conversation_joins_a_running_batch_and_finishes_first(
    backend: TritonBackend,
) -> None:
    done: dict[str, float] = {}
    first: dict[str, float] = {}

    async def run(name: str, question: str, max_tokens: int) -> list[ChatDelta]:
        deltas = []
        async for d in backend.chat_stream("chat", conversation(question), params(max_tokens)):
            first.setdefault(name, time.monotonic())
            deltas.append(d)
        done[name] = time.monotonic()
        return deltas

    long = asyncio.create_task(run("long", "Tell a long story about a dragon.", 160))
    while "long" not in first:  # the long one is decoding
        await asyncio.sleep(0.01)
    short = await run("short", "Say hello.", 6)
    assert not long.done(), "the short conversation did not wait for the long one to end"
    long_deltas = await long
    assert first["short"] < done["long"] and done["short"] < done["long"]
    assert short[-1].completion_tokens == 6 and short[-1].finish_reason == "length"
    assert long_deltas[-1].completion_tokens == 160 or long_deltas[-1].finish_reason == "stop"


async def test_each_conversation_keeps_its_own_max_tokens_and_stop_strings(backend: TritonBackend) -> None:
    question = "List five colours, one per line."
    [full] = await backend.chat("chat", [(conversation(question), params(40))])
    assert isinstance(full, ChatOutput)
    words = full.text.split()
    assert len(words) > 4
    stop = words[3]  # a word that appears part-way through
    cut = full.text[: full.text.find(stop)]

    stopped, three, seven = await asyncio.gather(
        stream(backend, question, 40, stop=[stop]),
        stream(backend, "Tell a long story about a dragon.", 3),
        stream(backend, "Tell a long story about a dragon.", 7),
    )
    assert "".join(d.text for d in stopped) == cut, "nothing past the stop string was streamed"
    assert stopped[-1].finish_reason == "stop"
    assert (three[-1].finish_reason, three[-1].completion_tokens) == ("length", 3)
    assert (seven[-1].finish_reason, seven[-1].completion_tokens) == ("length", 7)
    assert "".join(d.text for d in seven).startswith("".join(d.text for d in three))


async def test_a_bad_conversation_gets_an_error_and_its_neighbours_succeed(backend: TritonBackend) -> None:
    good = (conversation("Say yes."), params(8))
    items = [
        good,
        (json.dumps([{"role": "wizard", "content": "hi"}]), params(8)),
        (conversation("Say no."), json.dumps({"max_tokens": -1})),
        ("not json", params(8)),
        good,
    ]
    results = await backend.chat("chat", items)
    assert [type(r) for r in results] == [ChatOutput, ModelError, ModelError, ModelError, ChatOutput]
    assert "role" in str(results[1]) and "max_tokens" in str(results[2])
    assert results[0] == results[4]
    with pytest.raises(ModelError, match="MESSAGES"):
        async for _ in backend.chat_stream("chat", "[]", params(8)):
            pass


async def test_cancelling_streams_frees_their_slots_within_a_step(
    backend: TritonBackend, triton: Triton
) -> None:
    streams = [
        backend.chat_stream("chat", conversation(f"Write a long essay about topic {i}."), params(256))
        for i in range(SLOTS)
    ]
    for s in streams:  # every slot is decoding a long generation
        await anext(s)
    assert busy_slots(triton) == SLOTS

    steps_at_cancel = model_metric(triton, "chat_decode_steps")
    for s in streams:
        await s.aclose()
    deadline = time.monotonic() + 10
    while busy_slots(triton) > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert busy_slots(triton) == 0, "cancelled sequences still hold their slots"
    # Left alone, the essays had ~250 more steps to go. Each stops at the step after its
    # cancel arrives; the metrics lag a step at most.
    steps = model_metric(triton, "chat_decode_steps") - steps_at_cancel
    assert steps <= 3, f"{steps:g} decode steps after the cancel"

    after = await stream(backend, "Say hi.", 4)  # a free slot takes it at once
    assert after[-1].completion_tokens == 4


async def test_a_conversation_whose_replica_is_down_streams_from_another(triton: Triton) -> None:
    dead = f"127.0.0.1:{free_port()}"  # a primary nothing listens on, listed first and weighted up
    backend = TritonBackend(f"{dead}*4,{triton.grpc_url}")
    try:
        deltas = [d async for d in backend.chat_stream("chat", conversation("Say hi."), params(4))]
        alone = await stream_from(triton, "Say hi.", 4)
        assert "".join(d.text for d in deltas) == "".join(d.text for d in alone)
        assert deltas[-1].completion_tokens == 4
        first = backend.replicas.replicas[0]
        assert first.name == dead and first.breaker.state != CircuitState.closed, (
            "the dead replica was not tripped"
        )
    finally:
        await backend.aclose()


async def stream_from(triton: Triton, question: str, max_tokens: int) -> list[ChatDelta]:
    b = TritonBackend(triton.grpc_url)
    try:
        return await stream(b, question, max_tokens)
    finally:
        await b.aclose()
