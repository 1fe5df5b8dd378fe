"""Server-sent events: ``stream: true`` on ``/v1/chat/completions``, and ``GET /v1/jobs/{id}/events``.

Both read the job's Redis Stream (``producer/contract/streams.py``) with blocking reads; the
job itself goes through the queue to a worker like any other.

- ``POST /v1/chat/completions`` with ``stream: true`` answers ``text/event-stream`` in OpenAI's
  chunk format: a ``chat.completion.chunk`` whose delta carries ``role: assistant``, content
  chunks, a chunk with the ``finish_reason``, the usage chunk (empty ``choices``) if
  ``stream_options.include_usage``, then ``data: [DONE]``. A failure after the stream began is
  a ``data: {"error": {...}}`` chunk (the openai SDK raises it as an ``APIError``). A client
  that disconnects cancels the job: a queued one never runs, a running one stops generating.
- ``GET /v1/jobs/{id}/events``: every event of a job's stream as ``id``/``event``/``data``,
  from the first (or after ``Last-Event-ID``), ending with its terminal ``status`` event, whose
  data is the result envelope. Another tenant's job is a 404; a disconnect only stops reading.

Limits: at most ``max_streams`` responses open per tenant (tenants file; 429 with code
``too_many_streams`` past it), and ``OVERSPILL_STREAM_IDLE_TIMEOUT_S`` without an event ends a
response with an error event (code ``stream_idle_timeout``).
"""

# No ``from __future__ import annotations``: FastAPI must see the dependency built in
# stream_router as an object, not as a name it cannot resolve from this module's globals.
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import anyio
import structlog
from fastapi import APIRouter, Depends, Header, Request
from prometheus_client import Gauge, Histogram
from starlette.responses import StreamingResponse

from ..contract import (
    EVENT_DELTA,
    EVENT_ERROR,
    JobKind,
    JobOptions,
    Keys,
    Lane,
    Status,
    StreamEvent,
    StreamIdle,
    TenantSpec,
    parse_body,
    read_events,
    valid_event_id,
)
from ..errors import ApiError, RateLimited
from .state import idempotency_of

log = structlog.get_logger("producer.api")

STREAMS_OPEN = Gauge("overspill_api_streams_open", "SSE responses open", ["endpoint"])
TTFT = Histogram(
    "overspill_api_stream_ttft_seconds",
    "Streamed chat: request received to its first content chunk sent",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SLOT_LEASE_S = 60.0  # an open response renews its slot; one whose API process died lapses after this

# KEYS: a tenant's open streams (sorted set, scored by when each lapses). ARGV: limit, now,
# lapse_at, member. Drops lapsed slots, then takes one if there is room: 1 taken, 0 full.
LUA_STREAM_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) - tonumber(ARGV[2])) + 60)
return 1
"""


class StreamSlots:
    """At most ``tenant.max_streams`` SSE responses open per tenant, across API processes."""

    def __init__(self, redis: Any, keys: Keys, lease_s: float = SLOT_LEASE_S) -> None:
        self.redis = redis
        self.keys = keys
        self.lease_s = lease_s
        self._take = redis.register_script(LUA_STREAM_SLOT)

    async def take(self, tenant: TenantSpec) -> str:
        member = secrets.token_hex(8)
        now = time.time()
        args = [tenant.max_streams, now, now + self.lease_s, member]
        if not await self._take(keys=[self.keys.open_streams(tenant.name)], args=args):
            raise RateLimited(
                f"tenant has {tenant.max_streams} streams open, its limit; retry when one ends",
                retry_after_s=1.0,
                code="too_many_streams",
            )
        return member

    async def renew(self, tenant: TenantSpec, member: str) -> None:
        await self.redis.zadd(
            self.keys.open_streams(tenant.name), {member: time.time() + self.lease_s}, xx=True
        )

    async def release(self, tenant: TenantSpec, member: str) -> None:
        await self.redis.zrem(self.keys.open_streams(tenant.name), member)


def _slots(api: Any) -> StreamSlots:
    slots: StreamSlots | None = getattr(api, "stream_slots", None)
    if slots is None:
        slots = api.stream_slots = StreamSlots(api.redis, api.keys)
    return slots


class _Renewer:
    """Renews a slot from the reader's idle passes, at most every third of its lease."""

    def __init__(self, slots: StreamSlots, tenant: TenantSpec, member: str) -> None:
        self.slots, self.tenant, self.member = slots, tenant, member
        self.at = time.monotonic()

    async def __call__(self) -> None:
        if time.monotonic() - self.at > self.slots.lease_s / 3:
            self.at = time.monotonic()
            await self.slots.renew(self.tenant, self.member)


async def _shielded(call: Callable[[], Awaitable[Any]]) -> None:
    """Run a clean-up to its end even while the response is being cancelled (disconnect)."""
    with anyio.CancelScope(shield=True):
        try:
            await call()
        except Exception:  # clean-up is best effort: the slot lapses, the job hits its deadline
            log.warning("stream clean-up failed", exc_info=True)


# ---------------------------------------------------------------------------- chat completions


def _data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def _error_chunk(error_type: str, message: str, code: str | None = None) -> bytes:
    return _data(
        {"error": {"message": message, "type": error_type, "param": None, "code": code or error_type}}
    )


class ChunkWriter:
    """A job's stream events as OpenAI ``chat.completion.chunk`` s."""

    def __init__(self, job_id: str, model: str, include_usage: bool) -> None:
        self.base = {
            "id": "chatcmpl-" + job_id.removeprefix("job_"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": None,
        }
        self.include_usage = include_usage
        self.finished = False  # the response is complete (or ended by an error chunk)
        self.first_content = False

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return _data({**self.base, "choices": [choice]})

    def role(self) -> bytes:
        return self.chunk({"role": "assistant", "content": ""})

    def event(self, event: StreamEvent) -> list[bytes]:
        if event.event == EVENT_DELTA:
            out = [self.chunk({"content": event.text})] if event.text else []
            self.first_content = self.first_content or bool(event.text)
            if event.data.get("finish_reason"):
                out.append(self.chunk({}, event.data["finish_reason"]))
            return out
        if event.event == EVENT_ERROR:
            self.finished = True
            return [
                _error_chunk(str(event.data.get("type", "api_error")), str(event.data.get("message", "")))
            ]
        if event.terminal:
            self.finished = True
            return self._terminal(event.data)
        return []

    def _terminal(self, envelope: dict[str, Any]) -> list[bytes]:
        if envelope.get("status") != Status.succeeded.value:
            error = envelope.get("error") or {}
            status = str(envelope.get("status"))
            return [
                _error_chunk(
                    str(error.get("type", status)), str(error.get("message", f"the job is {status}"))
                )
            ]
        out = []
        usage = (envelope.get("body") or {}).get("usage")
        if self.include_usage and usage is not None:
            model = (envelope.get("body") or {}).get("model", self.base["model"])
            out.append(_data({**self.base, "model": model, "choices": [], "usage": usage}))
        out.append(b"data: [DONE]\n\n")
        return out


async def chat_stream(
    request: Request, api: Any, tenant: TenantSpec, body: dict[str, Any]
) -> StreamingResponse:
    """``POST /v1/chat/completions`` with ``stream: true``: submit the job, relay its stream."""
    started = time.perf_counter()
    parsed = parse_body(JobKind.chat, body, api.settings.limits)  # a 400 before any slot is taken
    slots = _slots(api)
    member = await slots.take(tenant)
    try:
        options = JobOptions(
            lane=Lane.interactive,
            deadline=api.settings.sync_timeout_s,
            tenant=tenant.name,
            idempotency_key=idempotency_of(request),
            stream=True,
        )
        job_id = await api.submit(tenant, JobKind.chat, body, options)
    except BaseException:
        await slots.release(tenant, member)
        raise
    structlog.contextvars.bind_contextvars(job_id=job_id)
    writer = ChunkWriter(job_id, parsed.model, parsed.include_usage)
    renew = _Renewer(slots, tenant, member)

    async def relay() -> AsyncIterator[bytes]:
        STREAMS_OPEN.labels("chat").inc()
        timed = False
        try:
            yield writer.role()
            events = read_events(
                api.redis, api.keys, job_id, idle_timeout_s=api.settings.stream_idle_timeout_s, on_wait=renew
            )
            async for event in events:
                for chunk in writer.event(event):
                    yield chunk
                if writer.first_content and not timed:
                    timed = True
                    TTFT.observe(time.perf_counter() - started)
                if writer.finished:
                    return
        except StreamIdle as exc:
            yield _error_chunk("timeout_error", f"the stream was idle too long: {exc}", "stream_idle_timeout")
        finally:
            STREAMS_OPEN.labels("chat").dec()
            if not writer.finished:  # the client went away (or the stream idled): stop the job
                log.info("stream reader gone; job cancelled", job_id=job_id)
                await _shielded(lambda: api.client.stop_stream(job_id, tenant=tenant.name))
            await _shielded(lambda: slots.release(tenant, member))

    return StreamingResponse(relay(), media_type="text/event-stream", headers=SSE_HEADERS)


# ---------------------------------------------------------------------------- job events


def _sse(event: StreamEvent) -> bytes:
    head = f"id: {event.id}\n" if event.id is not None else ""
    data = json.dumps(event.data, separators=(",", ":"), ensure_ascii=False)
    return f"{head}event: {event.event}\ndata: {data}\n\n".encode()


TenantDependency = Callable[..., Awaitable[TenantSpec]]


def stream_router(tenant_of: TenantDependency) -> APIRouter:
    router = APIRouter(tags=["jobs"])
    Tenant = Annotated[TenantSpec, Depends(tenant_of)]  # noqa: N806

    @router.get(
        "/v1/jobs/{job_id}/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}, "description": "The job's events (SSE)"}},
    )
    async def job_events(
        job_id: str,
        request: Request,
        tenant: Tenant,
        last_event_id: Annotated[
            str | None, Header(alias="Last-Event-ID", description="Resume after this event id")
        ] = None,
    ) -> StreamingResponse:
        """The job's events as server-sent events: status changes and token deltas, each with its
        stream entry id, ending with the terminal status event (its data is the result envelope)."""
        api = request.app.state.api
        after = last_event_id or "0"
        if not valid_event_id(after):
            raise ApiError(f"Last-Event-ID {after!r} is not an event id", param="Last-Event-ID")
        await api.client.get(job_id, tenant=tenant.name)  # 404 for an unknown or another tenant's job
        slots = _slots(api)
        member = await slots.take(tenant)
        renew = _Renewer(slots, tenant, member)

        async def relay() -> AsyncIterator[bytes]:
            STREAMS_OPEN.labels("events").inc()
            try:
                events = read_events(
                    api.redis,
                    api.keys,
                    job_id,
                    after,
                    idle_timeout_s=api.settings.stream_idle_timeout_s,
                    on_wait=renew,
                )
                async for event in events:
                    yield _sse(event)
            except StreamIdle as exc:
                idle = {"type": "stream_idle_timeout", "message": f"the stream was idle too long: {exc}"}
                yield _sse(StreamEvent(None, EVENT_ERROR, idle))
            finally:
                STREAMS_OPEN.labels("events").dec()
                await _shielded(lambda: slots.release(tenant, member))

        return StreamingResponse(relay(), media_type="text/event-stream", headers=SSE_HEADERS)

    return router


__all__ = ["ChunkWriter", "StreamSlots", "chat_stream", "stream_router"]
