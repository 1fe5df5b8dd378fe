"""What a chat request needs beyond plain text generation, and what a model offers.

A request that asks for tools (or carries a tool-call history), a ``response_format`` other
than text, or ``logprobs`` needs a model that can do it; a long conversation needs a context
window that holds it. Models declare what they offer (:class:`Offers`: the local model in the
worker's settings, each remote in the providers file); a job needing what the local model
lacks goes to a remote that has it (``route_reason: capability``) or, when it may not leave
or no remote can, is refused with the field that asked for it.

The API and the worker read the same raw body with :func:`lacking`, so a job refused at the
door and a job refused by a worker (one queued by the Python client) get the same sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Capability(StrEnum):
    tools = "tools"  # function calling: ``tools``, ``tool_choice``, tool messages and tool calls
    response_format = "response_format"  # JSON mode and structured outputs
    logprobs = "logprobs"  # ``logprobs`` / ``top_logprobs``
    context = "context"  # a prompt and completion longer than the model's context window


ALL_FEATURES = frozenset({Capability.tools, Capability.response_format, Capability.logprobs})
# Characters per token when a prompt's length must be judged before it is tokenised. Three is
# the low end for English with BPE tokenizers (four is typical), so a long prompt is sent
# where the context surely holds it rather than one that may not fit.
CHARS_PER_TOKEN = 3.0
MESSAGE_OVERHEAD_TOKENS = 4  # a chat template's role markers per message
DEFAULT_COMPLETION_TOKENS = 128  # ChatRequest.token_budget's default


class Offers(BaseModel):
    """What one model (local, or on a remote) serves beyond plain text generation."""

    model_config = ConfigDict(extra="forbid")

    features: set[Capability] = Field(default_factory=set)
    context_tokens: int | None = Field(default=None, ge=1)  # None: no limit known here

    def union(self, other: Offers) -> Offers:
        """What at least one of the two offers (the API's view of a model's remotes)."""
        if self.context_tokens is None or other.context_tokens is None:
            context = None
        else:
            context = max(self.context_tokens, other.context_tokens)
        return Offers(features=self.features | other.features, context_tokens=context)


REMOTE_DEFAULT = Offers(features=set(ALL_FEATURES))  # an OpenAI-compatible API: all, no known limit


def needs(body: Mapping[str, Any]) -> dict[Capability, str]:
    """The features a chat body needs, each with the first field that asks for it."""
    out: dict[Capability, str] = {}
    if body.get("tools"):
        out[Capability.tools] = "tools"
    elif body.get("tool_choice") not in (None, "none"):
        out[Capability.tools] = "tool_choice"
    else:
        for i, message in enumerate(body.get("messages") or ()):
            if isinstance(message, Mapping) and (message.get("role") == "tool" or message.get("tool_calls")):
                out[Capability.tools] = f"messages.{i}"
                break
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text"):
        out[Capability.response_format] = "response_format"
    if body.get("logprobs"):
        out[Capability.logprobs] = "logprobs"
    elif body.get("top_logprobs"):
        out[Capability.logprobs] = "top_logprobs"
    return out


def estimated_tokens(body: Mapping[str, Any]) -> int:
    """A (validated) body's prompt tokens judged from its characters, plus its completion's."""
    completion = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_COMPLETION_TOKENS
    chars = 0
    messages = body.get("messages") or ()
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p.get("text") or "") for p in content if isinstance(p, Mapping))
    return int(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS * len(messages) + int(completion)


def lacking(body: Mapping[str, Any], offers: Offers) -> dict[Capability, str]:
    """What ``body`` needs that ``offers`` does not have, each with the field that asks for it."""
    out = {cap: field for cap, field in needs(body).items() if cap not in offers.features}
    if offers.context_tokens is not None and estimated_tokens(body) > offers.context_tokens:
        out[Capability.context] = "messages"
    return out


STAYS = "locally, and this job may not leave (local_only or route 'local')"


def refusal(
    body: Mapping[str, Any], model: str, local: Offers | None, remote: Offers | None, stays_local: bool
) -> tuple[str, str] | None:
    """Why a chat body can run nowhere it may, as (sentence, field), or None when it can:
    ``local`` is None for a remote-only model, ``remote`` (what the remotes serving the model
    offer between them) None where none does. The API's check and the worker's rule."""
    missing = lacking(body, local) if local is not None else {}
    if local is not None and not missing:
        return None
    if stays_local and local is not None:
        return describe_lack(model, missing, STAYS)
    if remote is not None:
        missing = lacking(body, remote)
        if not missing:
            return None
    return describe_lack(model, missing, "on any remote" if local is None else "locally or on any remote")


def describe_lack(model: str, missing: dict[Capability, str], where: str) -> tuple[str, str]:
    """The refusal's sentence and the field it names, for the first thing missing."""
    cap, field = next(iter(missing.items()))
    if cap == Capability.context:
        what = "a context long enough for these messages and max_tokens"
    else:
        what = {Capability.tools: "tool calls", Capability.response_format: "response_format",
                Capability.logprobs: "logprobs"}[cap]  # fmt: skip
    return f"{field}: model {model!r} offers no {what} {where}", field


__all__ = [
    "ALL_FEATURES",
    "CHARS_PER_TOKEN",
    "Capability",
    "Offers",
    "REMOTE_DEFAULT",
    "describe_lack",
    "estimated_tokens",
    "lacking",
    "needs",
    "refusal",
]
