"""Streamed chat: what a backend yields while it generates, and how it reaches the job's stream.

A backend's ``chat_stream(model, messages_json, params_json)`` is an async iterator of
:class:`ChatDelta`; closing it early (``aclose``) cancels the generation on the backend.

:class:`StreamHub` writes the events of every streamed job of this process: what all of them
emitted during one event-loop tick goes out in one pipeline, a job's consecutive deltas merged
into one entry, and the same pipeline reads each job's cancel flag. Generation never waits
for Redis: a job waits only before its result is written, so that every delta precedes the
terminal event (which finish.lua appends, see ``producer/contract/streams.py``). How a job
runs over its backends is :mod:`workers.streaming.chat`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from producer.contract import (
    EVENT_DELTA,
    STREAM_MAXLEN,
    STREAM_TTL_S,
    Keys,
    delta_fields,
    error_fields,
    get_logger,
    status_fields,
)

from ..backends.base import ChatDelta

log = get_logger(__name__)


# ---------------------------------------------------------------------------- writing


class JobStream:
    """One job's side of the hub: events waiting to be written, and its cancel flag."""

    def __init__(self, hub: StreamHub, job_id: str) -> None:
        self.hub = hub
        self.job_id = job_id
        self.key = hub.keys.stream(job_id)
        self.cancel_key = hub.keys.stream_cancel(job_id)
        self.buffer: list[dict[str, Any]] = []  # events not yet sent: {"event", ...data}
        self.inflight = 0
        self.cancelled = False  # set from the flag read with this job's last write
        self.error: BaseException | None = None

    def status(self, status: str, **extra: Any) -> None:
        self.buffer.append({"fields": status_fields(status, **extra)})
        self.hub.schedule(self)

    def delta(self, text: str, finish: ChatDelta | None = None) -> None:
        """Queue new text; consecutive deltas of one tick become one entry."""
        last = self.buffer[-1] if self.buffer else None
        if last is not None and last.get("event") == EVENT_DELTA and last["finish"] is None:
            last["text"] += text
            last["finish"] = finish
        else:
            self.buffer.append({"event": EVENT_DELTA, "text": text, "finish": finish})
        self.hub.schedule(self)

    def error_event(self, error_type: str, message: str) -> None:
        self.buffer.append({"fields": error_fields(error_type, message)})
        self.hub.schedule(self)

    def take(self) -> list[dict[str, str]]:
        out = []
        for entry in self.buffer:
            if "fields" in entry:
                out.append(entry["fields"])
                continue
            finish: ChatDelta | None = entry["finish"]
            if finish is None:
                out.append(delta_fields(entry["text"]))
            else:
                out.append(
                    delta_fields(
                        entry["text"], finish.finish_reason, finish.prompt_tokens, finish.completion_tokens
                    )
                )
        self.buffer = []
        return out

    async def flush(self) -> None:
        """Wait until everything queued so far is in Redis; raise what writing it raised."""
        while self.buffer or self.inflight:
            await self.hub.next_cycle()
        if self.error is not None:
            raise self.error


class StreamHub:
    """Writes the queued events of all this process's streamed jobs, one pipeline a cycle."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._dirty: dict[str, JobStream] = {}
        self._task: asyncio.Task[None] | None = None
        self._next: asyncio.Future[None] | None = None

    def open(self, job_id: str) -> JobStream:
        return JobStream(self, job_id)

    def schedule(self, stream: JobStream) -> None:
        self._dirty[stream.job_id] = stream
        if self._task is None or self._task.done():
            # Runs on the loop's next turn: whatever else is emitted in this tick joins it.
            self._task = asyncio.get_running_loop().create_task(self._run())

    def next_cycle(self) -> asyncio.Future[None]:
        if self._next is None or self._next.done():
            self._next = asyncio.get_running_loop().create_future()
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(self._run())
        return self._next

    async def _run(self) -> None:
        while self._dirty:
            batch = list(self._dirty.values())
            self._dirty = {}
            done, self._next = self._next, None
            await self._write(batch)
            if done is not None and not done.done():
                done.set_result(None)
        if self._next is not None and not self._next.done():
            self._next.set_result(None)

    async def _write(self, batch: list[JobStream]) -> None:
        # Per job: one XADD per entry, an EXPIRE, then the EXISTS of its cancel flag.
        flags: list[tuple[JobStream, int]] = []
        at = 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in batch:
                entries = stream.take()
                stream.inflight += 1
                for fields in entries:
                    pipe.xadd(stream.key, fields, maxlen=STREAM_MAXLEN, approximate=True)
                pipe.expire(stream.key, STREAM_TTL_S)
                pipe.exists(stream.cancel_key)
                at += len(entries) + 2
                flags.append((stream, at - 1))
            try:
                results = await pipe.execute()
            except Exception as exc:  # each job sees it when it flushes
                for stream, _ in flags:
                    stream.error = exc
                    stream.inflight -= 1
                return
        for stream, index in flags:
            stream.cancelled = stream.cancelled or bool(results[index])
            stream.inflight -= 1


__all__ = ["JobStream", "StreamHub"]
