"""OpenAI's streamed chat on the wire: the request a stream sends and the SSE chunks it reads."""

from __future__ import annotations

import json
from typing import Any

from ...core.errors import RemoteBadResponse, RemoteUnavailable
from ..base import ChatDelta


def stream_payload(model: str, messages: str, params: str) -> dict[str, Any]:
    """A streamed chat request from ``chat_stream``'s arguments (those of Triton's model)."""
    sampling = json.loads(params)
    payload: dict[str, Any] = {
        "model": model,
        "messages": json.loads(messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    for name in ("max_tokens", "temperature", "top_p", "seed", "stop"):
        if sampling.get(name) not in (None, []):
            payload[name] = sampling[name]
    return payload


class ChunkParser:
    """OpenAI's chat SSE: ``data: {chunk}`` lines, then ``data: [DONE]``. The finish_reason and
    the usage chunk (``stream_options.include_usage``) may come apart: the last delta is given
    once both are known, or at ``[DONE]``."""

    def __init__(self) -> None:
        self.done = False
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, line: str) -> list[ChatDelta]:
        if not line.startswith("data:"):
            return []
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return [self._final("")] if self.finish is not None else []
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteBadResponse(
                f"the remote's stream sent a line that is not JSON: {data[:80]!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise RemoteBadResponse("the remote's stream sent a chunk that is not an object")
        if isinstance(chunk.get("error"), dict):
            raise RemoteUnavailable(f"the remote's stream failed: {chunk['error'].get('message', '')}"[:500])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        text = ""
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            self.finish = choice.get("finish_reason") or self.finish
        out = [ChatDelta(text)] if text else []
        if self.finish is not None and self.usage is not None:
            self.done = True
            out.append(self._final(""))
        return out

    def _final(self, text: str) -> ChatDelta:
        usage = self.usage or {}
        return ChatDelta(
            text,
            self.finish or "stop",
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
        )
