"""What every backend answers with, local or remote: a job's answer and chat's outputs.

A backend that streams chat (Triton's decoupled model, a remote's SSE) is a
:class:`ChatStreamer`: an async iterator of :class:`ChatDelta` that cancels the generation
when closed early (``aclose``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

import numpy as np

from ..core.errors import ModelError


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


class EmbedColumns(Sequence[Any]):
    """One embedding request's results as arrays: ``vectors`` float32 ``[rows, d]``, ``tokens``
    per row, and the model's error per row ("" where it has none).

    Read as a sequence it gives what an item of the request gets, ``(vector, tokens)`` or a
    :class:`ModelError`, for callers that take items one by one; a block takes the arrays."""

    __slots__ = ("vectors", "tokens", "errors")

    def __init__(self, vectors: np.ndarray, tokens: np.ndarray, errors: list[str]) -> None:
        self.vectors = vectors
        self.tokens = tokens
        self.errors = errors

    def __len__(self) -> int:
        return len(self.errors)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        error = self.errors[i]
        return ModelError(error) if error else (self.vectors[i], int(self.tokens[i]))

    def token_counts(self) -> list[int]:
        return [int(t) for t, e in zip(self.tokens.tolist(), self.errors, strict=True) if not e]
