"""Jobs on the remote: a job in, the same OpenAI/Cohere body the local handlers build out.

The body builders are shared (:mod:`workers.backends.bodies`), so a result does not depend
on where it ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from producer.contract import WIRE_FORMAT, ChatRequest, EmbeddingRequest, RerankRequest, WorkItem

from ...core.errors import RemoteBadResponse, RemoteLacks, RemoteRejected
from ...core.settings import ModelSpec, WorkerConfig
from ..base import Answer, ChatOutput
from ..bodies import chat_body, chat_params, embedding_body, rerank_body
from .client import RemoteBackend, empty_reply
from .config import RemoteConfig
from .schemas import Chat, Embeddings, Rerank, parse


class RemoteHandlers:
    """Runs a job on the remote and returns the body the local handlers would have built."""

    def __init__(self, config: WorkerConfig, remote: RemoteConfig, backend: RemoteBackend) -> None:
        self.config = config
        self.remote = remote
        self.backend = backend

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def run(self, item: WorkItem, request: Any, spec: ModelSpec) -> Answer:
        started = time.monotonic()
        if isinstance(request, EmbeddingRequest):
            body = await self._embed(item, request, spec)
        elif isinstance(request, RerankRequest):
            body = await self._rerank(item, request, spec)
        elif isinstance(request, ChatRequest):
            body = await self._chat(item, request, spec)
        else:
            raise RemoteRejected(f"no remote handler for {item.kind}")
        infer_ms = (time.monotonic() - started) * 1000
        return Answer(body, body["model"], infer_ms=infer_ms, batch_size=1)

    async def embed_many(
        self, jobs: Sequence[tuple[WorkItem, EmbeddingRequest]], spec: ModelSpec
    ) -> list[Answer | Exception]:
        """Embedding jobs that leave together, as one request (OpenAI's ``input`` list).

        A 4xx for the combined request could be one input's fault: then each job is sent
        alone, so only the offender fails. An outage raises for all (they fail over together).
        """
        if len(jobs) == 1:
            return [await self._alone(*jobs[0], spec)]
        started = time.monotonic()
        texts = [text for _, request in jobs for text in request.texts()]
        payload = {"model": self.remote.remote_model(spec.name), "input": texts, "encoding_format": "float"}
        if jobs[0][1].dimensions:
            payload["dimensions"] = jobs[0][1].dimensions
        give_up_at = min(item.deadline_at for item, _ in jobs)
        try:
            data = await self.backend.post("embeddings", payload, give_up_at=give_up_at)
        except RemoteLacks:
            raise
        except RemoteRejected:
            return list(await asyncio.gather(*(self._alone(item, request, spec) for item, request in jobs)))
        parsed = parse(Embeddings, data, "embeddings")
        by_index = {d.index: d.embedding for d in parsed.data}
        if sorted(by_index) != list(range(len(texts))):
            raise RemoteBadResponse(f"remote returned {len(parsed.data)} embeddings for {len(texts)} inputs")
        tokens = parsed.usage.prompt_tokens or parsed.usage.total_tokens
        chars = sum(len(t) for t in texts) or 1
        infer_ms = (time.monotonic() - started) * 1000
        answers: list[Answer | Exception] = []
        offset = 0
        for _, request in jobs:
            own = request.texts()
            vectors = [by_index[offset + k] for k in range(len(own))]
            offset += len(own)
            share = round(tokens * sum(len(t) for t in own) / chars)  # usage split by input size
            body = embedding_body(self._reported_model(spec), vectors, share, WIRE_FORMAT)
            answers.append(Answer(body, body["model"], infer_ms=infer_ms, batch_size=len(jobs)))
        return answers

    async def _alone(self, item: WorkItem, request: EmbeddingRequest, spec: ModelSpec) -> Answer | Exception:
        try:
            return await self.run(item, request, spec)
        except Exception as exc:  # this job's own outcome, whatever its companions get
            return exc

    def _payload(self, item: WorkItem, spec: ModelSpec) -> dict[str, Any]:
        # The job body is already the OpenAI/Cohere request: send its allowed fields, renamed.
        allowed = self.remote.forward_fields.get(item.kind, set())
        payload = {k: v for k, v in item.body.items() if k in allowed}
        payload["model"] = self.remote.remote_model(spec.name)
        return payload

    def reported_model(self, spec: ModelSpec) -> str:
        """The model a result body names when this remote ran it."""
        return self._reported_model(spec)

    def _reported_model(self, spec: ModelSpec) -> str:
        # Identical models keep our name; a different remote model is named as what it is.
        if spec.name in self.remote.same_models:
            return spec.name
        return self.remote.remote_model(spec.name)

    async def _embed(self, item: WorkItem, request: EmbeddingRequest, spec: ModelSpec) -> dict[str, Any]:
        # Ask for floats whatever the caller wants: we validate them, then store them as base64.
        payload = {**self._payload(item, spec), "encoding_format": "float"}
        data = await self.backend.post("embeddings", payload, give_up_at=item.deadline_at)
        parsed = parse(Embeddings, data, "embeddings")
        texts = request.texts()
        by_index = {d.index: d.embedding for d in parsed.data}
        if sorted(by_index) != list(range(len(texts))):
            raise RemoteBadResponse(f"remote returned {len(parsed.data)} embeddings for {len(texts)} inputs")
        vectors = [by_index[i] for i in range(len(texts))]
        tokens = parsed.usage.prompt_tokens or parsed.usage.total_tokens
        return embedding_body(self._reported_model(spec), vectors, tokens, WIRE_FORMAT)

    async def _rerank(self, item: WorkItem, request: RerankRequest, spec: ModelSpec) -> dict[str, Any]:
        data = await self.backend.post("rerank", self._payload(item, spec), give_up_at=item.deadline_at)
        parsed = parse(Rerank, data, "rerank")
        n_docs = len(request.documents)
        if any(not 0 <= r.index < n_docs for r in parsed.results):
            raise RemoteBadResponse("remote rerank returned a document index out of range")
        scores = [(r.index, r.relevance_score) for r in parsed.results]
        return rerank_body(item.id, self._reported_model(spec), request, scores, parsed.usage.total_tokens)

    async def _chat(self, item: WorkItem, request: ChatRequest, spec: ModelSpec) -> dict[str, Any]:
        payload = self._payload(item, spec)
        payload.pop("max_completion_tokens", None)
        payload["max_tokens"] = chat_params(request, self.config.limits)["max_tokens"]
        data = await self.backend.post("chat/completions", payload, give_up_at=item.deadline_at)
        parsed = parse(Chat, data, "chat/completions")
        choice, usage = parsed.choices[0], parsed.usage
        if not choice.message.content and not choice.message.refusal and not choice.message.tool_calls:
            # A 200 with nothing in it (a caching proxy with a bug sent this for every request): a
            # remote failure, never a silent success; as after a 5xx, the job fails over to the
            # local model (a remote-only one waits) and the remote's circuit counts it.
            empty_reply(self.remote, item.id, "plain")
        out = ChatOutput(
            choice.message.content or choice.message.refusal or "",
            choice.finish_reason or "stop",
            usage.prompt_tokens,
            usage.completion_tokens,
            choice.message.tool_calls,
            choice.logprobs,
        )
        return chat_body(item.id, self._reported_model(spec), out)
