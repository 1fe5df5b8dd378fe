"""The response bodies a remote must send, checked before anything is built from them.

A body that does not fit is :class:`RemoteBadResponse` (retried like a 5xx), never a crash.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from ...core.errors import RemoteBadResponse


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class EmbeddingDatum(BaseModel):
    index: int
    embedding: list[float]


class Embeddings(BaseModel):
    data: list[EmbeddingDatum]
    usage: Usage = Field(default_factory=Usage)


class RerankResult(BaseModel):
    index: int
    relevance_score: float


class Rerank(BaseModel):
    results: list[RerankResult]
    usage: Usage = Field(default_factory=Usage)


class Message(BaseModel):
    content: str | None = None
    refusal: str | None = None  # OpenAI's answer when the model declines: content is null then
    tool_calls: list[dict[str, Any]] | None = None  # passed on to the caller as they came


class Choice(BaseModel):
    message: Message
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None  # passed on as it came


class Chat(BaseModel):
    choices: list[Choice] = Field(min_length=1)
    usage: Usage = Field(default_factory=Usage)


Shape = TypeVar("Shape", bound=BaseModel)


def parse(shape: type[Shape], data: Any, endpoint: str) -> Shape:
    try:
        return shape.model_validate(data)
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"]) or "body"
        raise RemoteBadResponse(f"remote {endpoint} answered an unexpected body ({where})") from None
