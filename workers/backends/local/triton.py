"""The local backend: Triton Inference Server over gRPC (one shared aio client).

Each method sends one Triton request for a whole micro-batch and returns one result per
item, or a :class:`ModelError` for items the model rejected (the models report per-item
errors in an ``ERROR`` output instead of failing the request). tritonclient's single
exception type is translated here into the worker's error tree.

``url`` may list several replicas (:mod:`workers.backends.local.replicas`): each request goes to one of them,
and a replica failing mid-request has the request retried on another; only when no replica
serves does a call raise :class:`BackendUnavailable` (dispatch's Triton circuit then opens).

Chat is streamed: the ``chat`` model is decoupled and batches continuously, so each
conversation is a gRPC stream of its own (:meth:`TritonBackend.chat_stream`), and ``chat`` runs
one stream per item concurrently and collects them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc._utils import get_error_grpc
from tritonclient.utils import InferenceServerException

from ...core.endpoints import parse_endpoints
from ...core.errors import BackendUnavailable, InferenceFailed, ModelError, ModelNotFound, StreamCancelled
from ..base import ChatDelta, ChatOutput, EmbedColumns
from .replicas import REPLICA_OUTSTANDING, REPLICA_REQUESTS, Replica, ReplicaSet

# gRPC codes that mean "not now" rather than "this request is bad".
_UNAVAILABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED", "UNKNOWN")


@contextlib.contextmanager
def _translate(model: str) -> Iterator[None]:
    try:
        try:
            yield
        except grpc.RpcError as exc:  # a stream's own failures arrive untranslated
            raise get_error_grpc(exc) from exc
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

    async def embed(self, model: str, texts: list[str]) -> EmbedColumns:
        """The request's vectors as one matrix (rows read one by one where a caller wants)."""
        out = await self._infer(model, {"TEXT": _strings(texts)}, ["EMBEDDING", "TOKENS", "ERROR"])
        return EmbedColumns(out["EMBEDDING"], out["TOKENS"].reshape(-1), _errors(out["ERROR"]))

    async def rerank(self, model: str, pairs: list[tuple[str, str]]) -> list[tuple[float, int] | ModelError]:
        inputs = {"QUERY": _strings([q for q, _ in pairs]), "DOCUMENT": _strings([d for _, d in pairs])}
        out = await self._infer(model, inputs, ["SCORE", "TOKENS", "ERROR"])
        scores, tokens = out["SCORE"].reshape(-1), out["TOKENS"].reshape(-1)
        return [
            ModelError(err) if err else (float(scores[i]), int(tokens[i]))
            for i, err in enumerate(_errors(out["ERROR"]))
        ]

    async def chat(
        self, model: str, items: list[tuple[str, str] | tuple[str, str, asyncio.Event | None]]
    ) -> list[ChatOutput | ModelError | StreamCancelled]:
        """Each item streamed on its own and collected; a backend failure fails the call. An
        item may carry an event: once set (its job was cancelled), its generation stops."""
        tasks = [asyncio.ensure_future(self._collect(model, *item)) for item in items]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def _collect(
        self, model: str, messages: str, params: str, cancelled: asyncio.Event | None = None
    ) -> ChatOutput | ModelError | StreamCancelled:
        if cancelled is None:
            return await self._generate(model, messages, params)
        if cancelled.is_set():  # cancelled while it waited in the batcher: never sent
            return StreamCancelled("cancelled by the producer before it started")
        generation = asyncio.ensure_future(self._generate(model, messages, params))
        stop = asyncio.ensure_future(cancelled.wait())
        try:
            await asyncio.wait([generation, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if generation.done():
            return generation.result()
        generation.cancel()  # closes the stream: Triton cancels the request, the slot is freed
        with contextlib.suppress(asyncio.CancelledError):
            await generation
        return StreamCancelled("cancelled by the producer while it generated")

    async def _generate(self, model: str, messages: str, params: str) -> ChatOutput | ModelError:
        parts: list[str] = []
        try:
            async for delta in self.chat_stream(model, messages, params):
                parts.append(delta.text)
        except ModelError as exc:
            return exc
        return ChatOutput(
            "".join(parts), delta.finish_reason or "", delta.prompt_tokens, delta.completion_tokens
        )

    async def chat_stream(self, model: str, messages: str, params: str) -> AsyncIterator[ChatDelta]:
        """One conversation's deltas as the model generates them; the last one has the finish.

        Raises :class:`ModelError` if the model rejects the conversation. A replica failing
        before the first delta has the conversation sent to another; after it, the stream ends
        with :class:`BackendUnavailable`. Closing the iterator early cancels the generation.
        """
        inputs = []
        for name, value in (("MESSAGES", messages), ("PARAMS", params)):
            t = grpcclient.InferInput(name, [1, 1], "BYTES")
            t.set_data_from_numpy(_strings([value]))
            inputs.append(t)
        tried: set[Replica] = set()
        last: BackendUnavailable | None = None
        while (replica := self.replicas.pick(model, tried)) is not None:
            tried.add(replica)
            started = False
            try:
                # aclosing: our own early close must reach the stream call now, not at GC
                async with contextlib.aclosing(self._stream(replica, model, inputs)) as deltas:
                    async for delta in deltas:
                        started = True
                        yield delta
            except BackendUnavailable as exc:
                replica.breaker.trip()
                REPLICA_REQUESTS.labels(replica.name, model, "unavailable").inc()
                if started:
                    raise
                last = exc
                continue
            replica.breaker.record_success()
            REPLICA_REQUESTS.labels(replica.name, model, "ok").inc()
            return
        if last is not None:
            raise last
        raise BackendUnavailable(f"no Triton replica available for {model!r}")

    async def _stream(
        self, replica: Replica, model: str, inputs: list[grpcclient.InferInput]
    ) -> AsyncIterator[ChatDelta]:
        """One stream call carrying one request, held open until its final response."""
        assert replica.client is not None
        finished = asyncio.Event()

        async def requests() -> AsyncIterator[dict[str, object]]:
            yield {"model_name": model, "inputs": inputs}
            await finished.wait()  # half-closing early could end the stream before the responses

        replica.outstanding[model] = replica.outstanding.get(model, 0) + 1
        REPLICA_OUTSTANDING.labels(replica.name, model).set(replica.outstanding[model])
        call = None
        try:
            with _translate(model):
                call = replica.client.stream_infer(requests(), stream_timeout=self.timeout_s)
                async for result, error in call:
                    if error is not None:
                        raise error
                    out = {n: _errors(result.as_numpy(n))[0] for n in ("TEXT", "FINISH_REASON", "ERROR")}
                    if out["ERROR"]:
                        raise ModelError(out["ERROR"])
                    if not out["FINISH_REASON"]:
                        yield ChatDelta(out["TEXT"])
                        continue
                    prompt = int(result.as_numpy("PROMPT_TOKENS").reshape(-1)[0])
                    completion = int(result.as_numpy("COMPLETION_TOKENS").reshape(-1)[0])
                    yield ChatDelta(out["TEXT"], out["FINISH_REASON"], prompt, completion)
                    return
            raise BackendUnavailable(f"Triton {model!r} ended the stream before the final response")
        finally:
            finished.set()
            if call is not None:
                call.cancel()  # a no-op once the call is done; otherwise Triton cancels the request
            replica.outstanding[model] -= 1
            REPLICA_OUTSTANDING.labels(replica.name, model).set(replica.outstanding[model])
