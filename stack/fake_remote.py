"""A fake OpenAI-compatible remote on loopback, for tests, benchmarks and the demo.

It serves ``/v1/embeddings``, ``/v1/chat/completions`` and ``/v1/rerank`` with deterministic
answers:

- embeddings are hash-derived unit vectors of the requested model's dimension, computed
  exactly as the ``fixed_cost`` Triton model computes them, so "the same model" really is
  the same on both sides (tokens: words + 2 per input, as there);
- chat echoes the last user message, cut to ``max_tokens`` words; offered ``tools`` it calls the
  first (or ``tool_choice``'s) with ``{"input": <last user message>}``, after a ``tool``
  message it answers ``tool said: <its content>``; it answers JSON for a JSON
  ``response_format``, and made-up ``logprobs`` when asked;
- rerank scores each document by word overlap with the query;
- a chat request with ``stream: true`` is answered as OpenAI's SSE chunks, one word a chunk
  (role first, then content, then the finish; the usage chunk if
  ``stream_options.include_usage``; then ``data: [DONE]``).

Faults are steered at run time through a control API, so a test running this as a separate
process can script it:

- ``POST /_control`` ``{"latency_ms", "mode", "count", "retry_after", "api_keys", "dims"}``;
  ``mode`` is ``ok`` | ``429`` | ``500`` | ``503`` | ``400`` | ``timeout`` | ``garbage`` |
  ``truncated`` | ``empty`` (a well-formed 200 whose chat message is empty, as a caching proxy
  with a bug sends), applied to the next ``count`` requests (null: until changed);
  ``stream_delay_ms`` paces a stream's chunks; ``stream_fail_after`` N breaks every stream after
  its N-th content chunk, as ``stream_fail`` says: ``cut`` (the connection drops) or ``error``
  (an error chunk, as OpenAI sends one mid-stream);
- ``GET /_requests`` lists every API request received (path, model, key, status, body);
  ``DELETE /_requests`` forgets them and restores the default control; ``GET /_health``
  answers when the server is up.

Run it with ``python -m stack.fake_remote --port P`` or ``overspill fake-remote``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

DEFAULT_DIM = 384
MODEL_DIMS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
HANG_S = 300.0  # "timeout" mode: longer than any client waits
_WORD = re.compile(r"\w+")


def fake_embedding(text: str, dim: int) -> list[float]:
    """The ``fixed_cost`` model's vector: its text's SHAKE-256 stream as int16s, normalised."""
    raw = hashlib.shake_256(text.encode("utf-8")).digest(2 * dim)
    v = np.frombuffer(raw, dtype="<i2").astype(np.float32)
    return (v / np.linalg.norm(v)).tolist()  # type: ignore[no-any-return]


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def overlap_score(query: str, document: str) -> float:
    q = _words(query)
    return len(q & _words(document)) / len(q) if q else 0.0


class Control(BaseModel):
    model_config = ConfigDict(extra="forbid")

    latency_ms: float = 0.0
    mode: str = "ok"
    count: int | None = None  # faulty requests left; None: every request
    retry_after: str | None = "1"  # the 429 Retry-After header (seconds or an HTTP date)
    api_keys: list[str] = Field(default_factory=list)  # accepted keys; empty: any
    dims: dict[str, int] = Field(default_factory=dict)
    stream_delay_ms: float = 0.0
    stream_fail_after: int | None = None
    stream_fail: str = "cut"
    # The endpoints it serves; the others answer 404 as a server without them does.
    endpoints: list[str] = Field(
        default_factory=lambda: ["/v1/embeddings", "/v1/chat/completions", "/v1/rerank"]
    )


class FakeRemote:
    """The server's state: its control settings and the requests it has seen."""

    def __init__(self) -> None:
        self.control = Control()
        self.requests: list[dict[str, Any]] = []

    def fault(self) -> str:
        mode = self.control.mode
        if mode == "ok":
            return mode
        if self.control.count is not None:
            if self.control.count <= 0:
                return "ok"
            self.control.count -= 1
        return mode

    def dim(self, model: str) -> int:
        return self.control.dims.get(model, MODEL_DIMS.get(model, DEFAULT_DIM))


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


def embeddings(state: FakeRemote, body: dict[str, Any]) -> dict[str, Any]:
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    dim = int(body.get("dimensions") or state.dim(body["model"]))
    tokens = sum(len(t.split()) + 2 for t in texts)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": fake_embedding(t, dim)}
            for i, t in enumerate(texts)
        ],
        "model": body["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _text(content: Any) -> str:
    """A message's content as text: a string, a list of text parts, or null."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def chat(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    last = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    budget = int(body.get("max_tokens") or body.get("max_completion_tokens") or 128)
    message, words, finish = _answer(body, messages, last, budget)
    prompt = sum(len(_text(m.get("content")).split()) for m in messages)
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    if body.get("logprobs"):
        choice["logprobs"] = _logprobs(words, int(body.get("top_logprobs") or 0))
    return {
        "id": "chatcmpl-fake" + hashlib.sha256(str(messages).encode()).hexdigest()[:12],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": len(words),
            "total_tokens": prompt + len(words),
        },
    }


def _answer(
    body: dict[str, Any], messages: list[dict[str, Any]], last: str, budget: int
) -> tuple[dict[str, Any], list[str], str]:
    """The assistant's message, its words and finish: a tool call when tools are offered and no
    tool has answered yet; the tool's answer echoed after one; JSON when JSON is asked for."""
    tools = body.get("tools") or []
    answered = bool(messages) and messages[-1].get("role") == "tool"
    if tools and body.get("tool_choice") != "none" and not answered:
        name = _tool_name(tools, body.get("tool_choice"))
        arguments = json.dumps({"input": last})
        call_id = "call_" + hashlib.sha256(f"{name}{arguments}".encode()).hexdigest()[:16]
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}, arguments.split(), "tool_calls"
    if answered:
        text = f"tool said: {_text(messages[-1].get('content'))}"
    elif (body.get("response_format") or {}).get("type") in ("json_object", "json_schema"):
        text = json.dumps({"echo": last})
    else:
        text = f"echo: {last}"
    words = text.split()
    finish = "length" if len(words) > budget else "stop"
    words = words[:budget]
    return {"role": "assistant", "content": " ".join(words)}, words, finish


def _tool_name(tools: list[Any], choice: Any) -> str:
    """The function named by ``tool_choice``, else the first tool's."""
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return str(choice["function"].get("name") or "tool")
    first = tools[0] if isinstance(tools[0], dict) else {}
    return str((first.get("function") or {}).get("name") or "tool")


def _logprobs(words: list[str], top: int) -> dict[str, Any]:
    """OpenAI's ``logprobs.content``: each word's (made-up, deterministic) log probability."""
    entries = []
    for i, word in enumerate(words):
        alternatives = [{"token": f"{word}~{k}", "logprob": -1.0 - k, "bytes": None} for k in range(top)]
        entries.append(
            {
                "token": word,
                "logprob": -0.1 * (i % 5),
                "bytes": list(word.encode()),
                "top_logprobs": alternatives,
            }
        )
    return {"content": entries, "refusal": None}


class StreamCut(Exception):
    """Raised inside a streamed answer: the server drops the connection mid-response."""


async def chat_chunks(
    state: FakeRemote, body: dict[str, Any], answer: dict[str, Any]
) -> AsyncIterator[bytes]:
    """``answer`` as OpenAI's chat SSE: one word a chunk, paced and broken as the control says."""
    c = state.control
    base = {
        "id": answer["id"],
        "object": "chat.completion.chunk",
        "created": answer["created"],
        "model": answer["model"],
    }

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**base, "choices": choices, **extra}).encode() + b"\n\n"

    yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    content = answer["choices"][0]["message"]["content"]
    words = content.split(" ") if content else []
    for n, word in enumerate(words):
        if c.stream_fail_after is not None and n >= c.stream_fail_after:
            if c.stream_fail == "error":
                error = {
                    "message": "The server had an error while processing your request",
                    "type": "server_error",
                }
                yield b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
                return
            raise StreamCut("stream cut by the control")
        if c.stream_delay_ms:
            await asyncio.sleep(c.stream_delay_ms / 1000)
        text = word if n == 0 else " " + word
        yield event([{"index": 0, "delta": {"content": text}, "finish_reason": None}])
    yield event([{"index": 0, "delta": {}, "finish_reason": answer["choices"][0]["finish_reason"]}])
    if (body.get("stream_options") or {}).get("include_usage"):
        yield event([], usage=answer["usage"])
    yield b"data: [DONE]\n\n"


def rerank(body: dict[str, Any]) -> dict[str, Any]:
    docs = [d if isinstance(d, str) else d["text"] for d in body["documents"]]
    scored = sorted(
        ((i, overlap_score(body["query"], d)) for i, d in enumerate(docs)), key=lambda p: p[1], reverse=True
    )
    if body.get("top_n"):
        scored = scored[: int(body["top_n"])]
    results: list[dict[str, Any]] = []
    for i, score in scored:
        entry: dict[str, Any] = {"index": i, "relevance_score": score}
        if body.get("return_documents"):
            entry["document"] = {"text": docs[i]}
        results.append(entry)
    tokens = sum(len(d.split()) for d in docs) + len(body["query"].split()) * len(docs)
    return {
        "id": "rerank-fake",
        "results": results,
        "usage": {"total_tokens": tokens},
        "meta": {"billed_units": {"search_units": 1}},
    }


def create_app(state: FakeRemote | None = None) -> FastAPI:
    state = state or FakeRemote()
    app = FastAPI(title="overspill fake remote")
    app.state.fake = state

    async def serve(request: Request, path: str, build: Any) -> Response:
        auth = request.headers.get("authorization", "")
        key = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        raw = await request.body()
        record: dict[str, Any] = {"path": path, "key": key, "at": time.time(), "status": 200}
        state.requests.append(record)
        try:
            body = await request.json() if raw else {}
        except ValueError:
            body = None
        record["body"] = body
        record["model"] = body.get("model") if isinstance(body, dict) else None
        response = await respond(request, body, key, build)
        record["status"] = response.status_code
        return response

    async def respond(request: Request, body: Any, key: str, build: Any) -> Response:
        c = state.control
        if c.latency_ms:
            await asyncio.sleep(c.latency_ms / 1000)
        if request.url.path not in c.endpoints:
            return _error(404, f"Invalid URL (POST {request.url.path})", "invalid_request_error")
        if c.api_keys and key not in c.api_keys:
            return _error(401, f"Incorrect API key provided: {key}", "invalid_request_error")
        fault = state.fault()
        if fault == "timeout":
            await asyncio.sleep(HANG_S)
        if fault == "429":
            headers = {"Retry-After": c.retry_after} if c.retry_after else None
            return _error(429, "Rate limit reached; please retry", "rate_limit_error", headers)
        if fault in ("500", "503"):
            return _error(int(fault), "The server had an error processing your request", "server_error")
        if fault == "400":
            return _error(400, "This model's maximum context length was exceeded", "invalid_request_error")
        if fault == "garbage":
            return Response(b"<html>502 Bad Gateway</html>", media_type="application/json")
        if fault == "truncated":
            return Response(b'{"object": "list", "data": [{"object": "embe', media_type="application/json")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _error(400, "body must be a JSON object with a model", "invalid_request_error")
        try:
            answer = build(body)
            if fault == "empty" and answer.get("object") == "chat.completion":
                answer["choices"][0]["message"]["content"] = ""
                answer["usage"]["completion_tokens"] = 0
            if body.get("stream") is True and answer.get("object") == "chat.completion":
                return StreamingResponse(chat_chunks(state, body, answer), media_type="text/event-stream")
            return JSONResponse(answer)
        except (KeyError, TypeError, ValueError) as exc:
            return _error(400, f"invalid request: {exc!r}", "invalid_request_error")

    @app.post("/v1/embeddings")
    async def _embeddings(request: Request) -> Response:
        return await serve(request, "/v1/embeddings", lambda b: embeddings(state, b))

    @app.post("/v1/chat/completions")
    async def _chat(request: Request) -> Response:
        return await serve(request, "/v1/chat/completions", chat)

    @app.post("/v1/rerank")
    async def _rerank(request: Request) -> Response:
        return await serve(request, "/v1/rerank", rerank)

    @app.post("/_control")
    async def _control(update: dict[str, Any]) -> dict[str, Any]:
        state.control = Control.model_validate({**state.control.model_dump(), **update})
        return state.control.model_dump()

    @app.get("/_requests")
    async def _requests() -> list[dict[str, Any]]:
        return state.requests

    @app.delete("/_requests")
    async def _reset() -> dict[str, int]:
        forgotten = len(state.requests)
        state.requests.clear()
        state.control = Control()
        return {"forgotten": forgotten}

    @app.get("/_health")
    async def _health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def run(host: str = "127.0.0.1", port: int = 8900) -> None:
    import uvicorn

    # A hung request (the "timeout" fault) must not hold a stop: in-flight requests get 1 s.
    uvicorn.run(
        create_app(), host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=1
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    args = parser.parse_args(argv)
    run(args.host, args.port)


if __name__ == "__main__":
    main()
