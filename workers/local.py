"""The local backend: Triton Inference Server over gRPC (one shared aio client).

Each method sends one Triton request for a whole micro-batch and returns one result per
item, or a :class:`ModelError` for items the model rejected (the models report per-item
errors in an ``ERROR`` output instead of failing the request). tritonclient's single
exception type is translated here into the worker's error tree.

``url`` may list several replicas (:mod:`workers.replicas`): each request goes to one of them,
and a replica failing mid-request has the request retried on another; only when no replica
serves does a call raise :class:`BackendUnavailable` (dispatch's Triton circuit then opens).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from .errors import BackendUnavailable, InferenceFailed, ModelError, ModelNotFound
from .replicas import ReplicaSet, parse_endpoints

# gRPC codes that mean "not now" rather than "this request is bad".
_UNAVAILABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED", "UNKNOWN")


@dataclass(slots=True)
class ChatOutput:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


@contextlib.contextmanager
def _translate(model: str) -> Iterator[None]:
    try:
        yield
    except InferenceServerException as exc:
        status = str(exc.status() or "")
        message = exc.message() or str(exc)
        if "unknown model" in message.lower() or "not found" in message.lower():
            raise ModelNotFound(f"Triton does not serve model {model!r}") from exc
        if any(code in status for code in _UNAVAILABLE) or not status:
            raise BackendUnavailable(f"Triton unavailable for {model!r}: {message}") from exc
        raise InferenceFailed(f"Triton {model!r} failed: {message}") from exc
    except (ConnectionError, OSError) as exc:
        raise BackendUnavailable(f"Triton unreachable: {exc}") from exc


def _strings(values: list[str]) -> np.ndarray:
    return np.array([v.encode() for v in values], dtype=np.object_).reshape(-1, 1)


def _errors(raw: np.ndarray) -> list[str]:
    return [e.decode() if isinstance(e, bytes) else str(e) for e in raw.reshape(-1)]


class TritonBackend:
    def __init__(self, url: str, *, timeout_s: float = 60.0) -> None:
        self.url = url  # one host:port, or the OVERSPILL_TRITON_URLS list form
        self.timeout_s = timeout_s
        self.replicas = ReplicaSet(parse_endpoints(url))
        self._client = self.replicas.replicas[0].client  # the first replica, for single-URL callers

    async def aclose(self) -> None:
        await self.replicas.aclose()

    async def ready(self) -> bool:
        """True while at least one replica is ready; probes each one (its breaker hears it)."""
        return any((await self.replicas.probe()).values())

    async def _infer(
        self, model: str, inputs: dict[str, np.ndarray], outputs: list[str]
    ) -> dict[str, np.ndarray]:
        tensors = []
        for name, array in inputs.items():
            dtype = "BYTES" if array.dtype == np.object_ else "FP32"
            t = grpcclient.InferInput(name, list(array.shape), dtype)
            t.set_data_from_numpy(array)
            tensors.append(t)
        requested = [grpcclient.InferRequestedOutput(n) for n in outputs]

        async def send(client: grpcclient.InferenceServerClient) -> dict[str, np.ndarray]:
            with _translate(model):
                result = await client.infer(model, tensors, outputs=requested, client_timeout=self.timeout_s)
                return {n: result.as_numpy(n) for n in outputs}

        return await self.replicas.call(model, send)

    async def embed(self, model: str, texts: list[str]) -> list[tuple[np.ndarray, int] | ModelError]:
        out = await self._infer(model, {"TEXT": _strings(texts)}, ["EMBEDDING", "TOKENS", "ERROR"])
        vectors, tokens = out["EMBEDDING"], out["TOKENS"].reshape(-1)
        return [
            ModelError(err) if err else (vectors[i], int(tokens[i]))
            for i, err in enumerate(_errors(out["ERROR"]))
        ]

    async def rerank(self, model: str, pairs: list[tuple[str, str]]) -> list[tuple[float, int] | ModelError]:
        inputs = {"QUERY": _strings([q for q, _ in pairs]), "DOCUMENT": _strings([d for _, d in pairs])}
        out = await self._infer(model, inputs, ["SCORE", "TOKENS", "ERROR"])
        scores, tokens = out["SCORE"].reshape(-1), out["TOKENS"].reshape(-1)
        return [
            ModelError(err) if err else (float(scores[i]), int(tokens[i]))
            for i, err in enumerate(_errors(out["ERROR"]))
        ]

    async def chat(self, model: str, items: list[tuple[str, str]]) -> list[ChatOutput | ModelError]:
        inputs = {"MESSAGES": _strings([m for m, _ in items]), "PARAMS": _strings([p for _, p in items])}
        names = ["TEXT", "FINISH_REASON", "PROMPT_TOKENS", "COMPLETION_TOKENS", "ERROR"]
        out = await self._infer(model, inputs, names)
        texts, reasons = _errors(out["TEXT"]), _errors(out["FINISH_REASON"])
        prompt, completion = out["PROMPT_TOKENS"].reshape(-1), out["COMPLETION_TOKENS"].reshape(-1)
        return [
            ModelError(err) if err else ChatOutput(texts[i], reasons[i], int(prompt[i]), int(completion[i]))
            for i, err in enumerate(_errors(out["ERROR"]))
        ]
