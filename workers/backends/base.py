"""What every backend answers with, local or remote: a job's answer and chat's outputs.

A backend that streams chat (Triton's decoupled model, a remote's SSE) is a
:class:`ChatStreamer`: an async iterator of :class:`ChatDelta` that cancels the generation
when closed early (``aclose``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class Answer:
    """A handler's result for one job."""

    body: dict[str, Any]
    model: str
    batch_ms: float = 0.0
    infer_ms: float = 0.0
    batch_size: int = 0
    batch_id: str = ""  # the (first) backend request that carried this job, for logs
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ChatOutput:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    # A remote's tool calls and logprobs, passed on unchanged (capability routing); a local
    # model produces neither.
    tool_calls: list[dict[str, Any]] | None = None
    logprobs: dict[str, Any] | None = None


@dataclass(slots=True)
class ChatDelta:
    """New text since the previous delta; the last delta of a sequence carries its finish."""

    text: str
    finish_reason: str | None = None  # "stop" | "length" on the last delta only
    prompt_tokens: int = 0  # set on the last delta
    completion_tokens: int = 0  # set on the last delta


class ChatStreamer(Protocol):
    """A backend that streams one conversation: what the streamed path runs over."""

    def chat_stream(self, model: str, messages: str, params: str) -> AsyncIterator[ChatDelta]: ...
