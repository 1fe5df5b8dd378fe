"""Streamed jobs: the per-job Redis Stream, its event shapes, and the blocking reader.

A streamed job (``options.stream``, or a chat body with ``stream: true``) has a Redis Stream
(``Keys.stream``) that its producer creates with a ``queued`` status event in the same
transaction as the job. The worker appends to it: a ``running`` status event, then ``delta``
events as tokens come back, then perhaps an ``error`` event; the terminal status event is
appended by the same Lua step that writes the job's result (finish.lua, cancel.lua), so it is
always the last entry and there is exactly one. Every entry has two fields::

    event   status | delta | error
    data    JSON: status   {"status": "queued" | "running", ...}; the terminal one is the
                           job's whole result envelope (it has "status" too)
                  delta    {"text": "...", "finish_reason": null | "stop" | "length",
                            "prompt_tokens"?, "completion_tokens"?}  (counts on the last one)
                  error    {"type": "stream_interrupted" | ..., "message": "..."}

The entry id (``1712345678901-0``) is the event id a reader resumes from. The stream is
bounded (``STREAM_MAXLEN``, far above a job's token budget, so nothing is trimmed in
practice) and expires ``STREAM_TTL_S`` after its last write, ``STREAM_DONE_TTL_S`` after the
terminal event. A reader that connects late reads from ``0`` and misses nothing.

The cancel flag (``Keys.stream_cancel``) asks the worker to stop a running streamed job: it
reads the flag in the same pipeline as its next write, closes the generation and ends the
job ``cancelled``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .keys import Keys
from .kinds import TERMINAL, Status

STREAM_MAXLEN = 4096  # entries; a job's token budget (<= 512 deltas) never reaches it
STREAM_TTL_S = 3600  # while the job is open, refreshed on every write
STREAM_DONE_TTL_S = 600  # after the terminal event: late readers may still replay it
CANCEL_TTL_S = 3600
READ_BLOCK_MS = 1000  # one blocking read waits at most this long before the record is checked

EVENT_STATUS = "status"
EVENT_DELTA = "delta"
EVENT_ERROR = "error"

EVENT_ID_PATTERN = r"^[0-9]{1,19}(-[0-9]{1,19})?$"  # a Redis stream entry id, as Last-Event-ID:
# 19 digits at most, so that every id the pattern admits fits the 64 bits Redis reads it into
_ENTRY_ID = re.compile(EVENT_ID_PATTERN)


@dataclass(slots=True)
class StreamEvent:
    """One entry of a job's stream; ``id`` is None for an event made up from the job record
    (its stream had expired, or the job was not streamed)."""

    id: str | None
    event: str
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.event == EVENT_STATUS and self.data.get("status") in TERMINAL

    @property
    def text(self) -> str:
        return str(self.data.get("text", "")) if self.event == EVENT_DELTA else ""


def valid_event_id(value: str) -> bool:
    """May ``value`` (a ``Last-Event-ID``) be given to XREAD?"""
    return _ENTRY_ID.fullmatch(value) is not None


def status_fields(status: Status | str, **extra: Any) -> dict[str, str]:
    return {"event": EVENT_STATUS, "data": json.dumps({"status": str(status), **extra})}


def delta_fields(
    text: str, finish_reason: str | None = None, prompt_tokens: int = 0, completion_tokens: int = 0
) -> dict[str, str]:
    data: dict[str, Any] = {"text": text, "finish_reason": finish_reason}
    if finish_reason is not None:
        data["prompt_tokens"] = prompt_tokens
        data["completion_tokens"] = completion_tokens
    return {"event": EVENT_DELTA, "data": json.dumps(data, ensure_ascii=False)}


def error_fields(error_type: str, message: str) -> dict[str, str]:
    return {"event": EVENT_ERROR, "data": json.dumps({"type": error_type, "message": message})}


def add_stream(pipe: Any, keys: Keys, job_id: str) -> None:
    """Create a job's stream with its ``queued`` event (on the submission's pipeline)."""
    key = keys.stream(job_id)
    pipe.xadd(key, status_fields(Status.queued), maxlen=STREAM_MAXLEN, approximate=True)
    pipe.expire(key, STREAM_TTL_S)


async def request_cancel(redis: Any, keys: Keys, job_id: str) -> None:
    """Ask the worker holding ``job_id`` to stop it: a generation stops, inputs still waiting in
    a batcher leave it; the job ends ``cancelled``. Work already sent to a backend finishes."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(keys.stream_cancel(job_id), "1", ex=CANCEL_TTL_S)
        pipe.incr(keys.cancel_epoch())
        await pipe.execute()


def _decode(entry_id: Any, fields: dict[Any, Any]) -> StreamEvent:
    def s(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    named = {s(k): s(v) for k, v in fields.items()}
    try:
        data = json.loads(named.get("data", "{}"))
    except ValueError:
        data = {}
    return StreamEvent(s(entry_id), named.get("event", ""), data if isinstance(data, dict) else {})


async def read_range(redis: Any, keys: Keys, job_id: str, after: str = "0") -> list[StreamEvent]:
    """Every entry after ``after`` that is in the stream now (no wait)."""
    start = "-" if after in ("0", "0-0") else f"({after}"
    entries = await redis.xrange(keys.stream(job_id), min=start, max="+")
    return [_decode(i, f) for i, f in entries]


async def _record_event(redis: Any, keys: Keys, job_id: str) -> StreamEvent | None:
    """The terminal event as the job record has it, when the job is over but its stream says
    nothing more (expired, or never created); None while the job is still open."""
    status, result = await redis.hmget(keys.job(job_id), ["status", "result"])
    if status is None:
        return StreamEvent(None, EVENT_STATUS, {"status": "gone"})
    if isinstance(status, bytes):
        status = status.decode()
    if status not in TERMINAL:
        return None
    data = json.loads(result) if result else {"status": status}
    return StreamEvent(None, EVENT_STATUS, data)


async def read_events(
    redis: Any,
    keys: Keys,
    job_id: str,
    after: str = "0",
    *,
    block_ms: int = READ_BLOCK_MS,
    idle_timeout_s: float | None = None,
    on_wait: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[StreamEvent]:
    """The job's events after ``after`` (``0``: from the first), as they arrive, ending with
    its terminal event.

    Each blocking read waits at most ``block_ms``; between reads the job record is checked, so
    a job that ended without a terminal entry (its stream expired) still ends the iteration.
    With ``idle_timeout_s``, :class:`StreamIdle` is raised after that long without an entry;
    ``on_wait`` is awaited after each read that found nothing (a reader's keep-alive).
    """
    key = keys.stream(job_id)
    last = after
    quiet_since = time.monotonic()
    while True:
        answer = await redis.xread({key: last}, count=256, block=block_ms)
        entries = answer[0][1] if answer else []
        for entry_id, fields in entries:
            event = _decode(entry_id, fields)
            last = event.id or last
            yield event
            if event.terminal:
                return
        if entries:
            quiet_since = time.monotonic()
            continue
        ended = await _record_event(redis, keys, job_id)
        if ended is not None:
            # The terminal entry may have landed between the read and the check: read it first.
            tail = await read_range(redis, keys, job_id, last)
            for event in tail:
                yield event
                if event.terminal:
                    return
            yield ended
            return
        if idle_timeout_s is not None and time.monotonic() - quiet_since > idle_timeout_s:
            raise StreamIdle(f"no event for {idle_timeout_s:g} s")
        if on_wait is not None:
            await on_wait()


class StreamIdle(TimeoutError):
    """A stream's reader waited its idle timeout without an event."""


__all__ = [
    "CANCEL_TTL_S",
    "EVENT_DELTA",
    "EVENT_ERROR",
    "EVENT_STATUS",
    "READ_BLOCK_MS",
    "STREAM_DONE_TTL_S",
    "STREAM_MAXLEN",
    "STREAM_TTL_S",
    "StreamEvent",
    "StreamIdle",
    "add_stream",
    "delta_fields",
    "error_fields",
    "read_events",
    "read_range",
    "request_cancel",
    "status_fields",
    "valid_event_id",
]
