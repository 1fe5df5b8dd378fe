"""Reading jobs back: get, wait (on the client's reply list), wait_many, iter_results (bulk
passes over chunks and records), stream, and cancel. :class:`Client` is built on this."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aioredis

from ..contract import (
    BlockRow,
    ErrorInfo,
    JobKind,
    JobResult,
    Keys,
    Limits,
    Status,
    StreamEvent,
    chunk_of,
    group_by_chunk,
    read_events,
    read_result,
    request_cancel,
    valid_event_id,
    valid_id,
)
from ..errors import JobNotFound, JobTimeout, OverspillError
from .chunks import MAX_POLL_S, MIN_POLL_S, ChunkReader
from .records import envelope_from_record, envelope_from_reply
from .replies import MAX_RECHECK_S, RECHECK_S, Replies

# Statuses that are not final yet; anything else (terminal, or a vanished record) is fetched.
# A finished job as a pass hands it on: envelope JSON, an envelope, or a row of a result block.
Finished = str | JobResult | BlockRow

_OPEN = frozenset({Status.queued.value, Status.running.value})
# A bulk reader's pass: jobs per script call, and the envelope bytes one call may return.
COLLECT_KEYS = 2000
COLLECT_BYTES = 8 << 20
# Bulk polling reads pending statuses at most this often once results start arriving.
SCAN_INTERVAL_S = 0.05
# While replies keep coming, the records of jobs still awaited on the reply list are read
# this often at least (a lost reply is found then, not only when the list falls silent).
RECHECK_EVERY_S = 30.0
# How long a cancel waits for a running job that is not a chat to leave its batcher: the worker
# looks every 0.1 s; a job still running after this has its inputs at the backend.
SWEEP_SETTLE_S = 1.0


class Reading:
    """The read and cancel half of :class:`Client`; the attributes are the client's."""

    keys: Keys
    redis: aioredis.Redis
    limits: Limits
    result_ttl_s: int
    _cancel: Any
    _collect: Any
    _chunks: ChunkReader
    _replies: Replies

    # ------------------------------------------------------------------ read

    async def get(self, job_id: str, *, tenant: str | None = None) -> JobResult:
        """The job's current envelope; :class:`JobNotFound` if unknown or another tenant's."""
        if not valid_id(job_id):
            raise JobNotFound(job_id)
        if chunk_of(job_id) is not None:
            return await self._chunks.get(job_id, tenant)
        record = await self.redis.hgetall(self.keys.job(job_id))
        return envelope_from_record(job_id, record, tenant)

    async def wait(self, job_id: str, timeout: float = 60.0, *, tenant: str | None = None) -> JobResult:
        """Block (on Redis, not a sleep loop) until the job is terminal or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        if self._replies.expects(job_id, tenant):
            return await self._wait_reply(job_id, deadline, tenant)
        if chunk_of(job_id) is not None:
            return await self._wait_polling(job_id, deadline, timeout, tenant)
        while True:
            result = await self.get(job_id, tenant=tenant)
            if result.done:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                raise JobTimeout(f"{job_id} still {result.status} after {timeout:.1f}s")
            done = self.keys.done(job_id)
            # BLMOVE a list onto itself: wakes on the first element and leaves it for other waiters.
            await self.redis.blmove(done, done, min(left, 5.0), "LEFT", "RIGHT")

    async def _wait_polling(
        self, job_id: str, deadline: float, timeout: float, tenant: str | None
    ) -> JobResult:
        """Wait for a job of a chunk: it has no done list, so poll at growing intervals."""
        interval = MIN_POLL_S
        while True:
            result = await self.get(job_id, tenant=tenant)
            left = deadline - time.monotonic()
            if result.done:
                return result
            if left <= 0:
                raise JobTimeout(f"{job_id} still {result.status} after {timeout:.1f}s")
            await asyncio.sleep(min(interval, left))
            interval = min(interval * 2, MAX_POLL_S)

    async def _wait_reply(self, job_id: str, deadline: float, tenant: str | None) -> JobResult:
        """Wait for a job submitted here: its envelope arrives on the reply list.

        The record is re-checked after ``RECHECK_S``, then at doubling intervals: a lost reply
        costs a little latency, and a long queue does not turn every waiter into a poller.
        """
        interval = RECHECK_S
        try:
            while True:
                left = deadline - time.monotonic()
                raw = await self._replies.take(job_id, min(left, interval))
                if raw is not None:
                    return envelope_from_reply(job_id, raw, tenant)
                status = await self.redis.hget(self.keys.job(job_id), "status")
                if status not in _OPEN:  # terminal (or gone): the record says what happened
                    return await self.get(job_id, tenant=tenant)
                if deadline - time.monotonic() <= 0:
                    raise JobTimeout(f"{job_id} still {status} after the wait")
                interval = min(interval * 2, MAX_RECHECK_S)
        finally:
            self._replies.forget(job_id)

    async def wait_many(
        self, job_ids: Sequence[str], timeout: float = 300.0, *, tenant: str | None = None
    ) -> list[JobResult]:
        """Wait for all ``job_ids``; results in the same order."""
        results: dict[str, JobResult] = {}
        async for result in self.iter_results(job_ids, timeout, tenant=tenant):
            results[result.id] = result
        return [results[i] for i in job_ids]

    async def iter_results(
        self, job_ids: Sequence[str], timeout: float = 300.0, *, tenant: str | None = None
    ) -> AsyncIterator[JobResult]:
        """Yield each job's terminal envelope as it becomes available (see :meth:`_passes`)."""
        async for finished in self._passes(job_ids, timeout, tenant):
            # Decoded one at a time as they are handed on: a pass's envelopes wait as JSON
            # text, so a caller that handles each result and drops it never has a pass's
            # worth of decoded vectors alive for the garbage collector to walk.
            for _, envelope in finished:
                if isinstance(envelope, str):
                    yield read_result(envelope)
                elif isinstance(envelope, BlockRow):
                    yield envelope.envelope()
                else:
                    yield envelope

    async def _passes(
        self, job_ids: Sequence[str], timeout: float, tenant: str | None
    ) -> AsyncIterator[list[tuple[str, Finished]]]:
        """Each pass's finished jobs, (job id, envelope JSON or envelope), until all are.

        Jobs submitted here with :meth:`submit` come back on this client's reply list, and are
        taken as they arrive: a pass over them costs what finished, not what is pending. Their
        records are read, in case a reply was lost, only once no reply has come for
        ``RECHECK_S`` (then at doubling intervals), and at least every ``RECHECK_EVERY_S``.

        Other jobs are polled: each pass is one script call per ``COLLECT_KEYS`` pending jobs,
        which returns the finished ones with their envelopes (up to a byte budget), and one
        ``HMGET`` per chunk with pending jobs; between passes it blocks on Redis until the
        oldest polled job with a record of its own is done, and passes are at least
        ``SCAN_INTERVAL_S`` apart.
        """
        unique = list(dict.fromkeys(job_ids))
        plain, grouped = group_by_chunk(unique)  # each id parsed once (a regex each)
        pending = [unique[p] for p in plain]
        chunks = {c: [(unique[p], i) for p, i in members] for c, members in grouped.items()}
        awaited = {i for i in pending if self._replies.expects(i, tenant)}  # on the reply list
        if awaited:
            pending = [i for i in pending if i not in awaited]
        feed = self._replies.subscribe(list(awaited))
        seen: dict[str, int] = {}  # chunk id → its terminal jobs at the last pass
        deadline = time.monotonic() + timeout
        recheck_in = RECHECK_S
        recheck_at = time.monotonic() + recheck_in
        must_recheck_at = time.monotonic() + RECHECK_EVERY_S
        try:
            while pending or chunks or awaited:
                scanned = time.monotonic()
                finished: list[tuple[str, Finished]] = []
                finished += await self._chunks.take_finished(chunks, tenant, seen) if chunks else []
                finished += await self._finished(pending, tenant) if pending else []
                if finished and pending:
                    gone = {job_id for job_id, _ in finished}
                    pending = [i for i in pending if i not in gone]
                replies = _arrived(feed, awaited)
                if replies:  # the list works: its silence, not the clock, is what calls for a look
                    recheck_in, recheck_at = RECHECK_S, scanned + RECHECK_S
                finished += replies
                if awaited and scanned >= min(recheck_at, must_recheck_at):
                    # No reply for a while, or a long while since the last look: a reply may
                    # have been lost, so ask the records of the jobs still awaited.
                    late = await self._finished(list(awaited), tenant)
                    awaited.difference_update(job_id for job_id, _ in late)
                    self._replies.unsubscribe([job_id for job_id, _ in late], done=True)
                    finished += late
                    recheck_in = min(recheck_in * 2, MAX_RECHECK_S)
                    recheck_at, must_recheck_at = scanned + recheck_in, scanned + RECHECK_EVERY_S
                if finished:
                    yield finished
                if not (pending or chunks or awaited):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    waiting = len(pending) + len(awaited) + sum(map(len, chunks.values()))
                    raise JobTimeout(f"{waiting} jobs unfinished after {timeout:.1f}s")
                if not pending and not chunks:  # only replies to wait for: no pacing needed
                    due = min(recheck_at, must_recheck_at)
                    await _next_arrival(feed, min(left, due - time.monotonic()))
                    continue
                if pending:  # jobs of chunks have no done list: the pacing below is their wait
                    done = self.keys.done(pending[0])
                    await self.redis.blmove(done, done, min(left, 1.0), "LEFT", "RIGHT")
                # A pass costs O(pending): space passes out further while many are outstanding
                # (a plain job costs a script step, a chunk one command).
                interval = min(1.0, SCAN_INTERVAL_S + len(pending) * 2e-5 + len(chunks) * 2e-4)
                await asyncio.sleep(max(0.0, scanned + interval - time.monotonic()))
        finally:
            self._replies.unsubscribe(list(awaited), done=False)

    async def _finished(
        self, pending: Sequence[str], tenant: str | None
    ) -> list[tuple[str, str | JobResult]]:
        """(job id, envelope JSON or envelope) of the jobs among ``pending`` (none of a chunk)
        that are finished (a missing one raises).

        One script call per ``COLLECT_KEYS`` jobs returns which are finished and, up to a byte
        budget, their envelopes: a pass costs a few commands, not one per job.
        """
        out: list[tuple[str, str | JobResult]] = []
        later: list[str] = []  # finished, but read whole: past the budget, no envelope, not ours
        for start in range(0, len(pending), COLLECT_KEYS):
            chunk = pending[start : start + COLLECT_KEYS]
            keys = [self.keys.job(job_id) for job_id in chunk]
            flat = await self._collect(keys=keys, args=[COLLECT_BYTES])
            for k in range(0, len(flat), 3):
                job_id, owner, envelope = chunk[int(flat[k])], flat[k + 1], flat[k + 2]
                if envelope and (tenant is None or owner == tenant):
                    out.append((job_id, envelope))
                else:
                    later.append(job_id)
        for job_id, record in zip(later, await self._fetch(later), strict=True):
            out.append((job_id, envelope_from_record(job_id, record, tenant)))
        return out

    async def _fetch(self, job_ids: Sequence[str]) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for start in range(0, len(job_ids), 1000):
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids[start : start + 1000]:
                    pipe.hgetall(self.keys.job(job_id))
                out.extend(await pipe.execute())
        return out

    # ------------------------------------------------------------------ stream

    async def stream(
        self,
        job_id: str,
        *,
        tenant: str | None = None,
        after: str = "0",
        idle_timeout_s: float | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """The job's events as they happen: status changes and token deltas, ending with its
        terminal status event (whose ``data`` is the result envelope).

        Reads the job's Redis Stream from ``after`` (an event id; ``0``, the default, is the
        start, so a late reader misses nothing). A job that was not streamed yields only its
        terminal event. :class:`JobNotFound` if unknown or another tenant's.
        """
        await self.get(job_id, tenant=tenant)  # exists, and is this tenant's
        if not valid_event_id(after):
            raise OverspillError(f"not a stream event id: {after!r}")
        async for event in read_events(self.redis, self.keys, job_id, after, idle_timeout_s=idle_timeout_s):
            yield event

    async def stop_stream(self, job_id: str, *, tenant: str = "default") -> None:
        """Its reader is gone: cancel a queued streamed job, and ask the worker running one to
        stop generating (it ends the job ``cancelled``). A finished job is left as it is."""
        result = await self.cancel(job_id, tenant=tenant)
        if result.status == Status.running:
            await request_cancel(self.redis, self.keys, job_id)

    # ------------------------------------------------------------------ cancel

    async def cancel(self, job_id: str, *, tenant: str = "default", settle_s: float = 0.0) -> JobResult:
        """Cancel a queued job; ask the worker holding a running one to stop it.

        A running chat job's generation stops within a step or two of the worker seeing the
        request (it polls every 0.1 s), and a job whose inputs still wait in a batcher leaves
        it; either ends ``cancelled``. A job whose inputs are at the backend finishes.
        ``settle_s`` waits that long for the job to end. Returns the envelope.
        """
        if chunk_of(job_id) is not None and valid_id(job_id):
            outcome = (await self._chunks.cancel([job_id], tenant))[job_id]
            if outcome == -1:
                raise JobNotFound(job_id)
            result = await self.get(job_id, tenant=tenant)
            return await self._stop(result, settle_s) if outcome == 2 else result
        current = await self.get(job_id, tenant=tenant)
        cancelled = current.model_copy(
            update={
                "status": Status.cancelled,
                "finished_at": time.time(),
                "error": ErrorInfo(type="cancelled", message="cancelled by the producer"),
            }
        )
        outcome = await self._cancel(
            keys=[self.keys.job(job_id), self.keys.done(job_id)],
            args=[tenant, cancelled.model_dump_json(), self.result_ttl_s, self.keys.root],
        )
        if outcome == -1:
            raise JobNotFound(job_id)
        return await self._stop(await self.get(job_id, tenant=tenant), settle_s)

    async def _stop(self, result: JobResult, settle_s: float) -> JobResult:
        """Ask the worker holding a running job to stop it; wait up to ``settle_s`` for it."""
        if result.status != Status.running:
            return result
        # Streamed or not, the flag stops a generation, and takes inputs not yet sent out of
        # their batcher; an embedding or rerank already at the backend finishes.
        await request_cancel(self.redis, self.keys, result.id)
        # A generation may take a step or two to stop; waiting inputs leave their batcher
        # at the worker's next poll, and inputs already sent are not waited for.
        wait_s = settle_s if result.kind == JobKind.chat else min(settle_s, SWEEP_SETTLE_S)
        if wait_s > 0:
            with contextlib.suppress(JobTimeout):
                result = await self.wait(result.id, wait_s, tenant=result.tenant)
        return result

    async def cancel_many(self, job_ids: Sequence[str], *, tenant: str = "default") -> int:
        """Cancel the queued ones of ``job_ids`` (pipelined); return how many were cancelled.

        Running and finished jobs are left alone, as by :meth:`cancel`; unknown ids are skipped.
        """
        chunked = [i for i in job_ids if chunk_of(i) is not None]
        outcomes = await self._chunks.cancel(chunked, tenant) if chunked else {}
        cancelled = sum(1 for o in outcomes.values() if o == 1)
        job_ids = [i for i in job_ids if chunk_of(i) is None]
        now = time.time()
        error = ErrorInfo(type="cancelled", message="cancelled by the producer")
        for start in range(0, len(job_ids), 1000):
            page = job_ids[start : start + 1000]
            records = await self._fetch(page)
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id, record in zip(page, records, strict=True):
                    if record.get("status") != Status.queued.value or record.get("tenant") != tenant:
                        continue
                    envelope = envelope_from_record(job_id, record, tenant).model_copy(
                        update={"status": Status.cancelled, "finished_at": now, "error": error}
                    )
                    await self._cancel(
                        keys=[self.keys.job(job_id), self.keys.done(job_id)],
                        args=[tenant, envelope.model_dump_json(), self.result_ttl_s, self.keys.root],
                        client=pipe,
                    )
                outcomes = await pipe.execute()
            cancelled += sum(1 for o in outcomes if o == 1)
        return cancelled


def _arrived(feed: asyncio.Queue[tuple[str, str]], awaited: set[str]) -> list[tuple[str, str]]:
    """The replies in ``feed`` for jobs still ``awaited`` (which are taken out of it)."""
    out: list[tuple[str, str]] = []
    while not feed.empty():
        job_id, envelope = feed.get_nowait()
        if job_id in awaited:
            awaited.discard(job_id)
            out.append((job_id, envelope))
    return out


async def _next_arrival(feed: asyncio.Queue[tuple[str, str]], timeout: float) -> None:
    """Return once ``feed`` holds a reply, or after ``timeout``; the reply stays in it."""
    if timeout <= 0 or not feed.empty():
        return
    getter = asyncio.ensure_future(feed.get())
    try:
        await asyncio.wait({getter}, timeout=timeout)
    finally:
        if getter.done() and not getter.cancelled():
            feed.put_nowait(getter.result())
        else:
            getter.cancel()
