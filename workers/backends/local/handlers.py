"""Per-kind execution on the local backend: request body in, OpenAI/Cohere response body out.

Each handler validates the body against the contract, splits it into batcher items (one
per input text, document or conversation), awaits them, and assembles the response.
An :class:`ItemError` fails this job only; a :class:`BackendError` propagates so the
package can retry the job later or elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from producer.contract import (
    WIRE_FORMAT,
    ChatRequest,
    EmbeddingRequest,
    ErrorType,
    InvalidBody,
    JobKind,
    Lane,
    RerankRequest,
    WorkItem,
    parse_body,
)

from ...core.cancels import CancelWatch
from ...core.errors import BackendError, InvalidRequest, ItemError, ModelNotFound, WorkerError
from ...core.metrics import record_batch, record_tokens
from ...core.settings import ModelSpec, WorkerConfig
from ..base import Answer, EmbedColumns
from ..bodies import chat_body, chat_params, embedding_body, rerank_body
from .batcher import MicroBatcher, Outcome
from .triton import TritonBackend

# Bytes one embedding value takes in a stored result: a unit-norm float32 widened to a double
# prints about 20 digits in JSON (json.dumps of 2 048 x 384 such values: 21.9 bytes each), or
# 4 bytes as base64.
BYTES_PER_VALUE = {"float": 21.0, "base64": 16 / 3}


def _text_tokens(text: str) -> int:
    """Tokens a text will take, estimated from its length: about 4 characters per token in
    English, so an over-estimate. ``python -m bench tokens`` measures its cost per text and its
    correlation with the tokenizer's counts, beside what the tokenizer would cost the worker:
    the model counts exactly where it matters, in its own runs."""
    return len(text) // 4 + 2


def _pair_tokens(pair: tuple[str, str]) -> int:
    return _text_tokens(pair[1])  # the document: the query is encoded once, apart


ESTIMATED_TOKENS: dict[JobKind, Any] = {JobKind.embed: _text_tokens, JobKind.rerank: _pair_tokens}


@dataclass(slots=True)
class Combined:
    values: list[Any]
    wait_ms: float
    infer_ms: float
    batch_size: int
    batch_id: str

    def answer(self, body: dict[str, Any], model: str) -> Answer:
        return Answer(body, model, self.wait_ms, self.infer_ms, self.batch_size, self.batch_id)


def _combine(outcomes: Sequence[Outcome]) -> Combined:
    """Raise the first error (backend errors first: they are not this job's fault)."""
    errors = [o.error for o in outcomes if o.error is not None]
    for err in errors:
        if isinstance(err, BackendError):
            raise err
    if errors:
        raise errors[0]
    return Combined(
        [o.value for o in outcomes],
        max(o.wait_ms for o in outcomes),
        max(o.infer_ms for o in outcomes),
        max(o.batch_size for o in outcomes),
        outcomes[0].batch_id,
    )


class LocalHandlers:
    """Runs jobs on Triton through one MicroBatcher per model."""

    def __init__(
        self, config: WorkerConfig, backend: TritonBackend, cancels: CancelWatch | None = None
    ) -> None:
        self.config = config
        self.backend = backend
        # Chat jobs watch their cancel flag while they run; a cancelled job's inputs still
        # waiting in a batcher are taken out of it.
        self.cancels = cancels
        self.batchers: dict[str, MicroBatcher[Any]] = {}
        for spec in config.local_models():
            self.batchers[spec.name] = MicroBatcher(
                spec.triton_model,
                self._infer_fn(spec),
                max_batch=spec.max_batch,
                max_wait_ms=spec.max_wait_ms,
                max_inflight=spec.max_inflight,
                flush_when_free=spec.flush_when_free,
                on_batch=record_batch,
                cost=ESTIMATED_TOKENS.get(spec.kind) if spec.max_batch_tokens else None,
                max_batch_tokens=spec.max_batch_tokens,
                lookahead=spec.batch_lookahead,
            )
            if cancels is not None:
                cancels.sweep(
                    self.batchers[spec.name].waiting_owners, self.batchers[spec.name].drop_cancelled
                )

    def _infer_fn(self, spec: ModelSpec) -> Any:
        method = {
            JobKind.embed: self.backend.embed,
            JobKind.rerank: self.backend.rerank,
            JobKind.chat: self.backend.chat,
        }
        call = method[spec.kind]

        async def infer(items: list[Any]) -> Any:
            return await call(spec.triton_model, items)

        async def infer_counted(items: list[Any]) -> Any:
            results = await call(spec.triton_model, items)
            if isinstance(results, EmbedColumns):
                record_tokens(spec.triton_model, results.token_counts())
            else:
                record_tokens(spec.triton_model, [r[1] for r in results if isinstance(r, tuple)])
            return results

        return infer if spec.kind == JobKind.chat else infer_counted

    async def aclose(self) -> None:
        for batcher in self.batchers.values():
            await batcher.aclose()
        if self.cancels is not None:
            await self.cancels.aclose()

    def backlog(self) -> int:
        return sum(b.backlog for b in self.batchers.values())

    def resolve(self, item: WorkItem) -> tuple[Any, ModelSpec]:
        """Validate the body and find its model; raise an ItemError for this job alone."""
        try:
            request = parse_body(item.kind, item.body, self.config.limits)
        except InvalidBody as exc:
            error = InvalidRequest(str(exc))
            error.type = exc.type  # invalid_request or limit_exceeded, as the contract says
            raise error from None
        spec = self.config.model_for(item.kind, request.model)
        if spec is None:
            served = ", ".join(s.name for s in self.config.models if s.kind == item.kind)
            raise ModelNotFound(
                f"model {request.model!r} is not served for {item.kind} jobs (served: {served})"
            )
        self._check_result_size(request, spec)
        return request, spec

    def _check_result_size(self, request: Any, spec: ModelSpec) -> None:
        """Refuse, before any inference, an embedding request whose result would be too big."""
        if not isinstance(request, EmbeddingRequest) or spec.dim is None:
            return
        values = len(request.texts()) * (request.dimensions or spec.dim)
        estimate = values * BYTES_PER_VALUE[request.encoding_format]
        limit = self.config.max_result_bytes
        if estimate > limit:
            error = InvalidRequest(
                f"the result would be about {estimate / 1e6:.1f} MB, over the {limit / 1e6:.1f} MB a job "
                "may store: send fewer inputs per request, or encoding_format 'base64' (4x smaller)"
            )
            error.type = ErrorType.limit_exceeded
            raise error

    async def run(self, item: WorkItem, resolved: tuple[Any, ModelSpec] | None = None) -> Answer:
        """Run ``item`` locally; ``resolved`` is ``resolve(item)`` when the caller already has it."""
        request, spec = resolved or self.resolve(item)
        (outcome,) = await self.run_many([(item, request)], spec)
        if isinstance(outcome, WorkerError):
            raise outcome
        return outcome

    async def run_many(
        self, jobs: Sequence[tuple[WorkItem, Any]], spec: ModelSpec
    ) -> list[Answer | WorkerError]:
        """Run jobs of one model together: one batcher submission for all their inputs.

        Returns, per job, its answer or the error of its first failed input (a backend error
        first: it is not the job's fault, and the caller may retry it elsewhere).
        """
        batcher = self.batchers[spec.name]
        inputs: list[Any] = []
        bounds: list[tuple[int, int]] = []
        owners: list[str] = []
        watched = [item.id for item, request in jobs if isinstance(request, ChatRequest) and self.cancels]
        for item, request in jobs:
            first = len(inputs)
            inputs.extend(self._inputs(request, item))
            bounds.append((first, len(inputs)))
            owners.extend([item.id] * (len(inputs) - first))
        priority = 0 if jobs and jobs[0][0].lane == Lane.interactive else 1
        if self.cancels is not None:
            self.cancels.start()  # a cancelled job's inputs leave the batcher before they go out
        try:
            group = jobs[0][0].tenant if jobs else ""  # a package holds one tenant's jobs
            outcomes = await batcher.submit_many(inputs, priority, owners, group)
        finally:
            for job_id in watched:
                self.cancels.unwatch(job_id)  # type: ignore[union-attr]  # watched only with a watch
        answers: list[Answer | WorkerError] = []
        for (item, request), (lo, hi) in zip(jobs, bounds, strict=True):
            if lo == hi:
                answers.append(InvalidRequest("the request has no inputs"))
                continue
            try:
                done = _combine(outcomes[lo:hi])
                answers.append(done.answer(self._body(item, request, spec, done.values), spec.name))
            except WorkerError as exc:
                answers.append(exc)
        return answers

    def _inputs(self, request: Any, item: WorkItem) -> list[Any]:
        """The batcher items of one request: texts, (query, document) pairs, or a conversation
        (with the event its cancel request sets, when the worker watches them)."""
        if isinstance(request, EmbeddingRequest):
            return request.texts()
        if isinstance(request, RerankRequest):
            return [(request.query, d) for d in request.texts()]
        if isinstance(request, ChatRequest):
            messages = json.dumps([{"role": m.prompt_role, "content": m.text} for m in request.messages])
            params = json.dumps(chat_params(request, self.config.limits))
            return [(messages, params, self.cancels.watch(item.id) if self.cancels else None)]
        raise WorkerError(f"no local handler for {type(request).__name__}")

    def _body(self, item: WorkItem, request: Any, spec: ModelSpec, values: list[Any]) -> dict[str, Any]:
        if isinstance(request, EmbeddingRequest):
            vectors = [vec for vec, _ in values]
            return embedding_body(spec.name, vectors, sum(t for _, t in values), WIRE_FORMAT)
        if isinstance(request, RerankRequest):
            scores = [(i, score) for i, (score, _) in enumerate(values)]
            return rerank_body(item.id, spec.name, request, scores, sum(t for _, t in values))
        return chat_body(item.id, spec.name, values[0])


__all__ = ["ItemError", "LocalHandlers"]
