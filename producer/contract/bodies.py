"""Request bodies per kind (the OpenAI / Cohere shapes), their size limits and validation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .capabilities import needs
from .kinds import JobKind
from .portable import portable_problem


class Limits(BaseModel):
    """Size limits per kind, enforced at submission and again in the worker."""

    max_embed_inputs: int = 2048
    max_input_chars: int = 32_000
    max_rerank_documents: int = 1000
    max_chat_messages: int = 64
    max_chat_chars: int = 32_000
    max_chat_tokens: int = 512


DEFAULT_LIMITS = Limits()


class _Body(BaseModel):
    # Unknown OpenAI fields are accepted and ignored, as an OpenAI server does for most.
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)


class EmbeddingRequest(_Body):
    """The OpenAI ``/v1/embeddings`` request body."""

    input: str | list[str]
    # base64: little-endian float32 bytes, base64-encoded (the openai SDK's default). It is also
    # the cheaper format to store, move and parse: a quarter of the bytes, no float printing.
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _no_token_ids(cls, v: Any) -> Any:
        # The SDK sends token ids ([[15339, 1917]]) for pre-tokenised input; the ids would be
        # those of OpenAI's tokenizer, not of the served model, so they cannot be honoured.
        if isinstance(v, list) and v and all(isinstance(t, int | list) for t in v):
            raise ValueError("token-id input is not supported: send the text")
        return v

    @field_validator("dimensions")
    @classmethod
    def _no_dimensions(cls, v: int | None) -> int | None:
        # The served embedding models are not trained for truncation (Matryoshka), so a shorter
        # vector would be a worse one: refuse it as OpenAI does for models without the option.
        if v is not None:
            raise ValueError("this model does not support specifying dimensions")
        return v

    @field_validator("input")
    @classmethod
    def _non_empty(cls, v: str | list[str]) -> str | list[str]:
        texts = [v] if isinstance(v, str) else v
        if not texts:
            raise ValueError("input must not be an empty list")
        for i, t in enumerate(texts):
            if not t.strip():
                raise ValueError(f"input[{i}] is empty")
        return v

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    def check_limits(self, limits: Limits) -> None:
        texts = self.texts()
        if len(texts) > limits.max_embed_inputs:
            raise LimitExceeded(f"input has {len(texts)} items; the limit is {limits.max_embed_inputs}")
        for i, t in enumerate(texts):
            if len(t) > limits.max_input_chars:
                raise LimitExceeded(
                    f"input[{i}] has {len(t)} characters; the limit is {limits.max_input_chars}"
                )


class TextPart(BaseModel):
    """One part of a message's ``content`` list; only text parts are served."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    # ``developer`` is the newer SDKs' name for ``system``; ``tool`` answers an assistant's tool
    # call (such conversations need a model with tools: producer/contract/capabilities.py).
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls, passed on as they are
    tool_call_id: str | None = Field(default=None, max_length=200)  # which call a tool message answers

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        """A part that is not text gets one clear sentence, not an error per union branch."""
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise ValueError(f"content part {i} is of type {kind!r}; only text parts are served")
        return value

    @model_validator(mode="after")
    def _content(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for a {self.role} message")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id is required for a tool message")
        return self

    @property
    def text(self) -> str:
        """The content as one string: text parts joined, ``null`` as empty."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    @property
    def prompt_role(self) -> str:
        """The role as the local chat template knows it."""
        return "system" if self.role == "developer" else self.role


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a usage chunk (empty ``choices``) at the end."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatRequest(_Body):
    """The OpenAI ``/v1/chat/completions`` request body.

    The local models generate text; ``tools``, a non-text ``response_format`` and ``logprobs``
    are accepted here and served by a remote that offers them (capability routing)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False  # before n: n's check reads it
    n: int = 1
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int, info: ValidationInfo) -> int:
        if v != 1 and info.data.get("stream"):
            raise ValueError("stream is not supported with n > 1")
        if v != 1:
            raise ValueError("n > 1 is not supported")
        return v

    @model_validator(mode="after")
    def _stream_options(self) -> ChatRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @model_validator(mode="after")
    def _unstreamed_features(self) -> ChatRequest:
        # A remote's tool-call and logprob deltas are not relayed: such requests are answered
        # whole. (A long conversation alone streams from a remote with a longer context.)
        if self.stream:
            features = {
                "tools": self.tools,
                "tool_choice": self.tool_choice,
                "response_format": self.response_format,
                "logprobs": self.logprobs,
                "top_logprobs": self.top_logprobs,
                "messages": [{"role": m.role, "tool_calls": m.tool_calls} for m in self.messages],
            }
            if found := needs(features):
                cap, field = next(iter(found.items()))
                raise ValueError(f"{field} ({cap.value}) is answered unstreamed: send stream false")
        return self

    @model_validator(mode="after")
    def _response_format(self) -> ChatRequest:
        kind = (self.response_format or {}).get("type", "text")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(f"response_format.type {kind!r} is not one of text, json_object, json_schema")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def token_budget(self, limits: Limits) -> int:
        return min(self.max_completion_tokens or self.max_tokens or 128, limits.max_chat_tokens)

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def check_limits(self, limits: Limits) -> None:
        if len(self.messages) > limits.max_chat_messages:
            raise LimitExceeded(f"{len(self.messages)} messages; the limit is {limits.max_chat_messages}")
        chars = sum(len(m.text) for m in self.messages)
        if chars > limits.max_chat_chars:
            raise LimitExceeded(f"messages hold {chars} characters; the limit is {limits.max_chat_chars}")
        asked = self.max_completion_tokens or self.max_tokens or 0
        if asked > limits.max_chat_tokens:
            raise LimitExceeded(f"max_tokens {asked} exceeds the limit {limits.max_chat_tokens}")


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str


class RerankRequest(_Body):
    """The Cohere/Jina ``/v1/rerank`` request body."""

    query: str = Field(min_length=1)
    documents: list[str | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]

    def check_limits(self, limits: Limits) -> None:
        if len(self.documents) > limits.max_rerank_documents:
            raise LimitExceeded(
                f"{len(self.documents)} documents; the limit is {limits.max_rerank_documents}"
            )
        for i, t in enumerate([self.query, *self.texts()]):
            if len(t) > limits.max_input_chars:
                where = "query" if i == 0 else f"documents[{i - 1}]"
                raise LimitExceeded(f"{where} has {len(t)} characters; the limit is {limits.max_input_chars}")


BODY_MODELS: dict[JobKind, type[_Body]] = {
    JobKind.embed: EmbeddingRequest,
    JobKind.chat: ChatRequest,
    JobKind.rerank: RerankRequest,
}


class InvalidBody(ValueError):
    """A request body that does not match its kind's schema or limits; ``param`` names the field."""

    type = "invalid_request"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class LimitExceeded(InvalidBody):
    type = "limit_exceeded"


def parse_body(
    kind: JobKind | str, body: Any, limits: Limits = DEFAULT_LIMITS
) -> EmbeddingRequest | ChatRequest | RerankRequest:
    """Validate ``body`` for ``kind``; raise :class:`InvalidBody` with a readable message."""
    try:
        model = BODY_MODELS[JobKind(kind)]
    except ValueError:
        raise InvalidBody(f"unknown job kind {kind!r}; expected one of chat, embed, rerank") from None
    if not isinstance(body, dict):
        raise InvalidBody(f"body must be a JSON object, not {type(body).__name__}")
    problem = portable_problem(body)
    if problem is not None:
        raise InvalidBody(problem)
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        raise InvalidBody(_describe(exc), param=_param(exc)) from None
    parsed.check_limits(limits)  # type: ignore[attr-defined]
    return parsed  # type: ignore[return-value]


_PLAIN_EMBED = frozenset({"input", "model", "encoding_format", "user"})
_ENCODINGS = ("float", "base64")


def check_body(kind: JobKind | str, body: Any, limits: Limits = DEFAULT_LIMITS) -> None:
    """:func:`parse_body`'s verdict without the model it builds: a bulk row (one text for an
    embedding model) is checked field by field, the same rules in a few comparisons, where the
    pydantic model cost a client more than the rest of its submission; any other body, and any
    row that fails a rule, goes through :func:`parse_body` for its error."""
    if (kind == JobKind.embed or kind == "embed") and type(body) is dict and _PLAIN_EMBED.issuperset(body):
        text, model, user = body.get("input"), body.get("model"), body.get("user", "")
        if (
            type(text) is str
            and type(model) is str
            and 0 < len(text) <= limits.max_input_chars
            and 0 < len(model) <= 200
            and type(user) is str
            and body.get("encoding_format", "float") in _ENCODINGS
            and text.strip()
            and ((text.isascii() and model.isascii() and user.isascii()) or portable_problem(body) is None)
        ):
            return
    parse_body(kind, body, limits)


def _describe(exc: ValidationError) -> str:
    """One sentence for the first failing field (the one ``param`` names); fix it, ask again."""
    errors = exc.errors()
    if not errors:
        return "the body is invalid"
    loc = ".".join(str(p) for p in errors[0]["loc"]) or "body"
    return f"{loc}: {errors[0]['msg'].removeprefix('Value error, ')}"


def _param(exc: ValidationError) -> str | None:
    """The first failing field as OpenAI names it (``messages.0.content``), None for the whole body."""
    errors = exc.errors()
    if not errors:
        return None
    return ".".join(str(p) for p in errors[0]["loc"]) or None
