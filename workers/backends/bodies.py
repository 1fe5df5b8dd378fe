"""Response bodies: one builder per response shape, shared by every backend.

A job's result body does not depend on where it ran (Triton, a remote, the cache).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from producer.contract import ChatRequest, JobKind, Limits, RerankRequest

from .base import ChatOutput


def response_id(kind: JobKind, job_id: str) -> str | None:
    """The ``id`` a response body carries for this job (embeddings have none)."""
    if kind == JobKind.chat:
        return "chatcmpl-" + job_id.removeprefix("job_")
    if kind == JobKind.rerank:
        return job_id
    return None


def encode_vector(vec: Sequence[float] | np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as the OpenAI API returns it: a list of floats, or base64 of float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
    return vec.tolist() if isinstance(vec, np.ndarray) else list(vec)


def embedding_body(
    model: str, vectors: Sequence[Sequence[float] | np.ndarray], tokens: int, encoding_format: str = "float"
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode_vector(vec, encoding_format)}
            for i, vec in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def rerank_body(
    job_id: str, model: str, request: RerankRequest, scores: list[tuple[int, float]], tokens: int
) -> dict[str, Any]:
    """Cohere/Jina body from (document index, score) pairs, best first, cut to ``top_n``."""
    docs = request.texts()
    ranked = sorted(scores, key=lambda pair: pair[1], reverse=True)
    if request.top_n is not None:
        ranked = ranked[: request.top_n]
    results = []
    for i, score in ranked:
        entry: dict[str, Any] = {"index": i, "relevance_score": score}
        if request.return_documents:
            entry["document"] = {"text": docs[i]}
        results.append(entry)
    return {
        "id": response_id(JobKind.rerank, job_id),
        "model": model,
        "results": results,
        "usage": {"total_tokens": tokens},
        "meta": {"billed_units": {"search_units": 1}},
    }


def chat_body(job_id: str, model: str, out: ChatOutput) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": out.text}
    if out.tool_calls:
        message["tool_calls"] = out.tool_calls
        message["content"] = out.text or None  # OpenAI's shape: no text beside the calls is null
    return {
        "id": response_id(JobKind.chat, job_id),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": out.finish_reason,
                "logprobs": out.logprobs,
            }
        ],
        "usage": {
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens,
        },
    }


def chat_params(request: ChatRequest, limits: Limits) -> dict[str, Any]:
    """Sampling parameters of a chat request, with its token budget applied."""
    return {
        "max_tokens": request.token_budget(limits),
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "stop": request.stops(),
    }
