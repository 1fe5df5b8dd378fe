"""Streamed chat jobs: run one over its backends in order, with failover and resume.

:class:`StreamedChat` runs one streamed job over its :class:`Source` s in order: a source that
fails before the first token hands the job to the next one (failover); after it, a failure
ends the stream with an error event and the job fails (``stream_interrupted``). A reader that
went away (the cancel flag, read with each write) closes the backend's iterator, which stops
the generation, and the job ends ``cancelled``.

A re-run of a job whose worker died mid-stream resumes its stream: the text already on it is
skipped while the new generation repeats it, and a generation that departs from it ends the
stream with an error event and fails the job (``stream_diverged``).
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from producer.contract import (
    EVENT_DELTA,
    ChatRequest,
    Keys,
    Limits,
    Route,
    RouteReason,
    WorkItem,
    get_logger,
    read_range,
)

from ..backends.base import Answer, ChatDelta, ChatOutput
from ..backends.bodies import chat_body, chat_params
from ..core.errors import (
    BackendUnavailable,
    ItemError,
    StreamCancelled,
    StreamDiverged,
    StreamInterrupted,
    WorkerError,
)
from ..core.metrics import STREAM_TTFT_MS, STREAMS, STREAMS_OPEN
from ..core.progress import LIVENESS, mark
from .hub import JobStream, StreamHub

log = get_logger(__name__)


@dataclass(slots=True)
class Source:
    """One backend a streamed job may run on, in the order they are tried."""

    route: Route
    reason: RouteReason
    model: str  # the model the result body names
    open: Callable[[str, str], Any]  # (messages_json, params_json) -> AsyncIterator[ChatDelta]
    failed: Callable[[Exception], None] = lambda exc: None  # before the first token
    succeeded: Callable[[], None] = lambda: None
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the provider, for the ledger


@dataclass(slots=True)
class Resume:
    """What the stream already carries from an earlier run of the job."""

    text: str = ""
    finished: bool = False

    @classmethod
    async def read(cls, redis: Any, keys: Keys, item: WorkItem) -> Resume:
        if item.attempt <= 1:
            return cls()
        events = await read_range(redis, keys, item.id)
        deltas = [e for e in events if e.event == EVENT_DELTA]
        return cls("".join(e.text for e in deltas), any(e.data.get("finish_reason") for e in deltas))


def conversation(request: ChatRequest, limits: Limits) -> tuple[str, str]:
    """The (messages_json, params_json) a backend's ``chat_stream`` takes."""
    messages = json.dumps([{"role": m.prompt_role, "content": m.text} for m in request.messages])
    return messages, json.dumps(chat_params(request, limits))


async def _opened(source: Source, messages: str, params: str) -> AsyncIterator[ChatDelta]:
    it = source.open(messages, params)
    if inspect.isawaitable(it):
        it = await it
    return it  # type: ignore[no-any-return]


async def close_stream(it: Any) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # the generation is being abandoned: its own error no longer matters
            log.debug("closing a backend stream failed", exc_info=True)


class StreamedChat:
    """Runs streamed chat jobs; one per worker process, over the shared :class:`StreamHub`."""

    def __init__(self, redis: Any, keys: Keys, limits: Limits) -> None:
        self.redis = redis
        self.keys = keys
        self.limits = limits
        self.hub = StreamHub(redis, keys)

    async def run(self, item: WorkItem, request: ChatRequest, sources: list[Source]) -> tuple[Answer, Source]:
        """Run ``item`` on the first source that yields a token; its answer and that source."""
        stream = self.hub.open(item.id)
        stream.status("running", attempt=item.attempt)
        resume = await Resume.read(self.redis, self.keys, item)
        messages, params = conversation(request, self.limits)
        started = time.monotonic()
        last: Exception | None = None
        for source in sources:
            try:
                answer = await self._on(source, item, stream, resume, messages, params, started)
            except WorkerError:
                await stream.flush()  # its error event goes before the job's terminal one
                raise
            except _NoToken as exc:
                last = exc.cause
                source.failed(exc.cause)
                log.warning(
                    "stream failed before its first token; next backend",
                    job_id=item.id,
                    route=source.route.value,
                    error=str(exc.cause)[:200],
                )
                continue
            return answer, source
        await stream.flush()
        if isinstance(last, BackendUnavailable):
            raise last
        raise BackendUnavailable(f"no backend could stream the job ({last})")

    async def _on(
        self,
        source: Source,
        item: WorkItem,
        stream: JobStream,
        resume: Resume,
        messages: str,
        params: str,
        started: float,
    ) -> Answer:
        route = source.route.value
        STREAMS_OPEN.labels(route).inc()
        try:
            return await self._generate(source, item, stream, resume, messages, params, started)
        except WorkerError as exc:
            exc.route = source.route
            STREAMS.labels(route, exc.type).inc()
            raise
        finally:
            STREAMS_OPEN.labels(route).dec()

    async def _generate(
        self,
        source: Source,
        item: WorkItem,
        stream: JobStream,
        resume: Resume,
        messages: str,
        params: str,
        started: float,
    ) -> Answer:
        generated: list[str] = []
        emitted = len(resume.text)
        first = True
        final: ChatDelta | None = None
        it: Any = None
        try:
            it = await _opened(source, messages, params)
            mark()  # the work has started: the package's time limit counts from its last delta
            async for delta in it:
                mark()
                LIVENESS.batch_done()
                if first and (delta.text or delta.finish_reason):
                    first = False
                    source.succeeded()
                    STREAM_TTFT_MS.labels(source.route.value).observe((time.monotonic() - started) * 1000)
                generated.append(delta.text)
                new = self._new_text(item, stream, resume, generated, emitted, delta)
                emitted += len(new)
                if delta.finish_reason is not None:
                    final = delta
                if new or (delta.finish_reason is not None and not resume.finished):
                    stream.delta(new, delta if delta.finish_reason is not None else None)
                if stream.cancelled:
                    raise StreamCancelled("the stream's reader went away")
                if stream.error is not None:
                    raise stream.error
        except (StreamCancelled, ItemError):  # the job's own end (a rejected conversation too)
            await close_stream(it)
            raise
        except WorkerError as exc:
            await close_stream(it)
            if first:
                raise _NoToken(exc) from None
            return await self._interrupted(stream, item, exc)
        except (OSError, ConnectionError) as exc:
            await close_stream(it)
            if first:
                raise _NoToken(BackendUnavailable(f"stream failed: {exc}")) from None
            return await self._interrupted(stream, item, exc)
        except BaseException:  # cancelled (a drain), or Redis failed: the generation stops too
            await close_stream(it)
            raise
        text = "".join(generated)
        if final is None:
            return await self._interrupted(stream, item, WorkerError("the stream ended without a finish"))
        if len(text) < len(resume.text):
            await self._diverged(stream, item)
        await stream.flush()
        STREAMS.labels(source.route.value, "ok").inc()
        out = ChatOutput(text, final.finish_reason or "stop", final.prompt_tokens, final.completion_tokens)
        body = chat_body(item.id, source.model, out)
        answer = Answer(body, source.model, infer_ms=(time.monotonic() - started) * 1000, batch_size=1)
        answer.extra.update(source.extra)
        return answer

    def _new_text(
        self,
        item: WorkItem,
        stream: JobStream,
        resume: Resume,
        generated: list[str],
        emitted: int,
        delta: ChatDelta,
    ) -> str:
        """The part of ``delta`` the stream does not carry yet (all of it unless resuming)."""
        if not resume.text:
            return delta.text
        so_far = "".join(generated)
        if len(so_far) <= len(resume.text):
            if not resume.text.startswith(so_far):
                raise self._diverged_now(stream, item)
            return ""
        if not so_far.startswith(resume.text):
            raise self._diverged_now(stream, item)
        return so_far[emitted:]

    def _diverged_now(self, stream: JobStream, item: WorkItem) -> StreamDiverged:
        message = "the job's re-run generated other text than its stream already carries"
        stream.error_event(StreamDiverged.type, message)
        log.warning("streamed re-run diverged", job_id=item.id)
        return StreamDiverged(message)

    async def _diverged(self, stream: JobStream, item: WorkItem) -> None:
        error = self._diverged_now(stream, item)
        await stream.flush()
        raise error

    async def _interrupted(self, stream: JobStream, item: WorkItem, cause: Exception) -> Answer:
        reason = cause.message if isinstance(cause, WorkerError) else f"{type(cause).__name__}: {cause}"
        message = f"the backend failed after the stream had begun: {reason}"
        stream.error_event(StreamInterrupted.type, message)
        await stream.flush()
        log.warning("stream interrupted", job_id=item.id, error=reason[:200])
        raise StreamInterrupted(message)


class _NoToken(Exception):
    """The source failed before its first token: the job may go to the next one."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


# ---------------------------------------------------------------------------- sources


__all__ = ["Resume", "Source", "StreamedChat", "close_stream", "conversation"]
