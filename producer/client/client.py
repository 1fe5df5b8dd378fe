"""Client library: submit jobs to Redis, poll or wait for their results, stream them, cancel them.

Submissions are packed: items of the same kind, model and lane travel together in one arq
job (a *work package*), because arq's per-job overhead, not the GPU, would otherwise cap
throughput. ``submit_many`` packs what it is given; concurrent ``submit`` calls are packed
by the :class:`Coalescer`. Every item keeps its own id, record and result.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ..contract import (
    DEFAULT_LIMITS,
    LUA_CANCEL,
    LUA_COLLECT,
    LUA_SUBMIT,
    ErrorInfo,
    InvalidBody,
    JobKind,
    JobOptions,
    JobResult,
    Keys,
    Limits,
    Status,
    StreamEvent,
    WorkItem,
    add_package,
    add_stream,
    chunk_of,
    connect,
    new_job_id,
    parse_body,
    read_events,
    request_cancel,
    valid_event_id,
    valid_id,
)
from ..errors import JobNotFound, JobTimeout, OverspillError
from .chunks import (
    MAX_POLL_S,
    MIN_POLL_S,
    ChunkReader,
    build_chunks,
    by_chunk,
    chunk_eligible,
    write_chunks,
)
from .coalescer import MAX_PACKAGE_BYTES, Coalescer, GroupKey, group_key, split
from .records import envelope_from_record, envelope_from_reply, record_args
from .replies import MAX_RECHECK_S, RECHECK_S, Replies

# Statuses that are not final yet; anything else (terminal, or a vanished record) is fetched.
_OPEN = frozenset({Status.queued.value, Status.running.value})
# A bulk reader's pass: jobs per script call, and the envelope bytes one call may return.
COLLECT_KEYS = 2000
COLLECT_BYTES = 8 << 20
# Bulk polling reads pending statuses at most this often once results start arriving.
SCAN_INTERVAL_S = 0.05

# Records written per script call (a submit_many of more goes out in several calls).
RECORDS_PER_CALL = 1000
# Deletes an idempotency claim only while it still names the job that made it.
LUA_RELEASE_CLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# submit() without options shares one validated instance.
_NO_OPTIONS = JobOptions()

# (kind, body), or (kind, body, metadata): per-item metadata merged over the shared options'.
Request = tuple[JobKind | str, dict[str, Any]] | tuple[JobKind | str, dict[str, Any], dict[str, str]]
# Called with the submission's transaction pipeline and the new job ids, to add commands that
# must commit atomically with the jobs (e.g. a batch recording its progress).
PipelineHook = Callable[[Any, list[str]], None]


class Client:
    """Async client. ``async with Client(url) as c: job = await c.submit("embed", body)``."""

    def __init__(
        self,
        redis_url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "overspill",
        limits: Limits = DEFAULT_LIMITS,
        pack_size: int = 32,
        pack_bytes: int = MAX_PACKAGE_BYTES,
        chunk_size: int = 256,
        result_ttl_s: int = 24 * 3600,
        coalesce_window_ms: float | None = 5.0,
        redis: aioredis.Redis | None = None,
    ) -> None:
        self.keys = Keys(prefix)
        self.limits = limits
        self.pack_size = pack_size
        self.pack_bytes = pack_bytes
        self.chunk_size = chunk_size
        self.result_ttl_s = result_ttl_s
        # A plain URL or a Sentinel one (producer.contract.redis); OVERSPILL_REDIS_* apply.
        self.redis: aioredis.Redis = redis or connect(redis_url)
        self._owns_redis = redis is None
        self._cancel = self.redis.register_script(LUA_CANCEL)
        self._collect = self.redis.register_script(LUA_COLLECT)
        self._release_claim = self.redis.register_script(LUA_RELEASE_CLAIM)
        self._chunks = ChunkReader(self.redis, self.keys, result_ttl_s)
        # Results of jobs sent with submit() come back on this client's reply list.
        self._replies = Replies(self.redis, self.keys)
        # None: every submit() is its own package (no added wait, no packing).
        self._coalescer = (
            Coalescer(
                self._enqueue_replying,
                window_ms=coalesce_window_ms,
                max_items=pack_size,
                max_bytes=pack_bytes,
            )
            if coalesce_window_ms is not None
            else None
        )

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._coalescer is not None:
            await self._coalescer.aclose()
        await self._replies.aclose()
        if self._owns_redis:
            await self.redis.aclose()

    # ------------------------------------------------------------------ submit

    async def submit(
        self, kind: JobKind | str, body: dict[str, Any], *, validate: bool = True, **options: Any
    ) -> str:
        """Enqueue one job and return its id. ``options`` are :class:`JobOptions` fields.

        Concurrent calls are coalesced into shared work packages (see ``coalesce_window_ms``).
        """
        opts = JobOptions.model_validate(options) if options else _NO_OPTIONS
        item = self._item(kind, body, opts, time.time(), validate)
        if opts.idempotency_key:
            existing = await self._claim_idempotency(opts.tenant, opts.idempotency_key, item.id)
            if existing is not None:
                return existing
        try:
            if self._coalescer is not None:
                await self._coalescer.add(item)
            else:
                await self._enqueue_replying([item])
        except BaseException:
            if opts.idempotency_key:  # the key names only a job that was written
                await self._release_idempotency(opts.tenant, opts.idempotency_key, item.id)
            raise
        return item.id

    async def _enqueue_replying(self, items: Sequence[WorkItem]) -> None:
        """Enqueue with this client's reply list in the records (webhook jobs need none)."""
        replying = [(i.id, i.tenant) for i in items if i.webhook is None]
        await self.enqueue(items, reply_to={job_id for job_id, _ in replying})
        self._replies.expect(replying)

    async def submit_many(
        self,
        requests: Iterable[Request],
        *,
        validate: bool = True,
        also: PipelineHook | None = None,
        chunked: bool | None = None,
        **options: Any,
    ) -> list[str]:
        """Enqueue many jobs sharing ``options``; packed up to ``pack_size`` (and ``pack_bytes``) per arq job.

        ``validate=False`` skips body validation here (the worker validates again and fails
        bad jobs individually); it exists for producers that must not block on schema checks.
        A request may carry its own metadata as a third element. ``also`` adds commands to
        the same transaction as the jobs (all of it commits, or none).

        On the bulk lane, without a webhook or a stream, jobs are written as *chunks* of up to
        ``chunk_size`` (``producer/contract/chunks.py``): one record and one package per chunk,
        each job still with its own id (``<chunk>.<index>``), result and status. ``chunked=False``
        keeps a record per job; ``True`` insists on chunks (an error where they cannot apply).
        """
        opts = JobOptions.model_validate(options)
        if opts.idempotency_key:
            raise OverspillError("idempotency_key applies to a single submission: use submit()")
        now = time.time()
        requests = requests if isinstance(requests, Sequence) else list(requests)
        eligible = chunk_eligible(opts) and not any(_streams(r[0], r[1]) for r in requests)
        if chunked and not eligible:
            raise OverspillError("chunks are for bulk jobs without a webhook or a stream")
        if eligible and chunked is not False:
            return await self._submit_chunks(requests, opts, now, validate, also)
        items = [self._item(r[0], r[1], _with_metadata(opts, r), now, validate) for r in requests]
        await self.enqueue(items, also=also)
        return [i.id for i in items]

    async def _submit_chunks(
        self,
        requests: Sequence[Request],
        opts: JobOptions,
        now: float,
        validate: bool,
        also: PipelineHook | None,
    ) -> list[str]:
        ids, chunks = build_chunks(
            requests,
            opts,
            now,
            size=self.chunk_size,
            max_bytes=self.pack_bytes,
            limits=self.limits,
            validate=validate,
        )
        async with self.redis.pipeline(transaction=True) as pipe:
            try:
                write_chunks(pipe, self.keys, chunks, self.result_ttl_s)
            except Exception as exc:  # nothing was sent: an item the wire cannot carry
                raise InvalidBody(f"a job cannot be written: {exc}") from exc
            if also is not None:
                also(pipe, ids)
            await pipe.execute()
        return ids

    def _item(
        self, kind: JobKind | str, body: dict[str, Any], opts: JobOptions, now: float, validate: bool
    ) -> WorkItem:
        if validate:
            parse_body(kind, body, self.limits)
        if opts.stream and kind != JobKind.chat:
            raise InvalidBody("options.stream applies to chat jobs only", param="options.stream")
        # Every field below is validated already (the options, the kind): skip a second pass.
        return WorkItem.model_construct(
            id=new_job_id(),
            kind=JobKind(kind),
            body=body,
            tenant=opts.tenant,
            lane=opts.lane,
            created_at=now,
            deadline_at=opts.deadline_at(now),
            route=opts.route,
            local_only=opts.local_only,
            webhook=opts.webhook,
            metadata=opts.metadata,
            attempt=0,
            stream=True if opts.stream or _streams(kind, body) else None,
        )

    async def _claim_idempotency(self, tenant: str, key: str, job_id: str) -> str | None:
        idem = self.keys.idempotency(tenant, key)
        if await self.redis.set(idem, job_id, nx=True, ex=self.result_ttl_s):
            return None
        return await self.redis.get(idem)

    async def _release_idempotency(self, tenant: str, key: str, job_id: str) -> None:
        with contextlib.suppress(RedisError, OSError):  # unreachable: the claim expires with its TTL
            await self._release_claim(keys=[self.keys.idempotency(tenant, key)], args=[job_id])

    async def enqueue(
        self,
        items: Sequence[WorkItem],
        *,
        also: PipelineHook | None = None,
        reply_to: set[str] | None = None,
    ) -> None:
        """Write item records and their work packages in one atomic pipeline.

        Records of the jobs in ``reply_to`` name this client's reply list.
        """
        groups: dict[GroupKey, list[WorkItem]] = defaultdict(list)
        for item in items:
            groups[group_key(item)].append(item)
        async with self.redis.pipeline(transaction=True) as pipe:
            try:
                self._queue_writes(pipe, items, groups, reply_to)
            except Exception as exc:  # nothing was sent: an item the wire cannot carry
                raise InvalidBody(f"a job cannot be written: {exc}") from exc
            if also is not None:
                also(pipe, [i.id for i in items])
            await pipe.execute()

    def _queue_writes(
        self,
        pipe: Any,
        items: Sequence[WorkItem],
        groups: dict[GroupKey, list[WorkItem]],
        reply_to: set[str] | None,
    ) -> None:
        """The records and packages of ``items``, added to ``pipe`` (serialised, not sent)."""
        for start in range(0, len(items), RECORDS_PER_CALL):
            chunk = items[start : start + RECORDS_PER_CALL]
            args: list[Any] = []
            for item in chunk:
                reply = self._replies.key if reply_to and item.id in reply_to else ""
                args += record_args(item, self.result_ttl_s, reply)
            # EVAL, not EVALSHA: a script missing after a Redis restart cannot half-apply a MULTI.
            pipe.eval(LUA_SUBMIT, len(chunk), *(self.keys.job(i.id) for i in chunk), *args)
        for item in items:
            if item.stream:
                add_stream(pipe, self.keys, item.id)
        for (_, _, lane), group in groups.items():
            for package in split(group, self.pack_size, self.pack_bytes):
                add_package(pipe, self.keys, package, lane)

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
        """Yield each job's terminal envelope as it becomes available (bulk polling).

        Each pass is one script call per ``COLLECT_KEYS`` pending jobs, which returns the
        finished ones with their envelopes (up to a byte budget), and one ``HMGET`` per chunk
        with pending jobs; between passes it blocks on Redis until the oldest pending job with
        a record of its own is done, and passes are at least ``SCAN_INTERVAL_S`` apart.
        """
        unique = list(dict.fromkeys(job_ids))
        pending = [i for i in unique if chunk_of(i) is None]
        chunks = (
            by_chunk([i for i in unique if chunk_of(i) is not None]) if len(pending) < len(unique) else {}
        )
        seen: dict[str, int] = {}  # chunk id → its terminal jobs at the last pass
        deadline = time.monotonic() + timeout
        while pending or chunks:
            scanned = time.monotonic()
            finished = await self._chunks.take_finished(chunks, tenant, seen) if chunks else []
            finished += await self._finished(pending, tenant) if pending else []
            for result in finished:
                yield result
            if finished and pending:
                gone = {r.id for r in finished}
                pending = [i for i in pending if i not in gone]
            if not pending and not chunks:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                waiting = len(pending) + sum(map(len, chunks.values()))
                raise JobTimeout(f"{waiting} jobs unfinished after {timeout:.1f}s")
            if pending:  # jobs of chunks have no done list: the pacing below is their wait
                done = self.keys.done(pending[0])
                await self.redis.blmove(done, done, min(left, 1.0), "LEFT", "RIGHT")
            # A pass costs O(pending): space passes out further while many are outstanding
            # (a plain job costs a script step, a chunk one command).
            interval = min(1.0, SCAN_INTERVAL_S + len(pending) * 2e-5 + len(chunks) * 2e-4)
            await asyncio.sleep(max(0.0, scanned + interval - time.monotonic()))

    async def _finished(self, pending: Sequence[str], tenant: str | None) -> list[JobResult]:
        """The envelopes of the jobs among ``pending`` (none of a chunk) that are finished (a
        missing one raises).

        One script call per ``COLLECT_KEYS`` jobs returns which are finished and, up to a byte
        budget, their envelopes: a pass costs a few commands, not one per job.
        """
        out: list[JobResult] = []
        later: list[str] = []  # finished, but read whole: past the budget, no envelope, not ours
        for start in range(0, len(pending), COLLECT_KEYS):
            chunk = pending[start : start + COLLECT_KEYS]
            keys = [self.keys.job(job_id) for job_id in chunk]
            flat = await self._collect(keys=keys, args=[COLLECT_BYTES])
            for k in range(0, len(flat), 3):
                job_id, owner, envelope = chunk[int(flat[k])], flat[k + 1], flat[k + 2]
                if envelope and (tenant is None or owner == tenant):
                    out.append(JobResult.model_validate_json(envelope))
                else:
                    later.append(job_id)
        for job_id, record in zip(later, await self._fetch(later), strict=True):
            out.append(envelope_from_record(job_id, record, tenant))
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

    async def cancel(self, job_id: str, *, tenant: str = "default") -> JobResult:
        """Cancel a queued job. A running job is not interrupted; its envelope is returned."""
        if chunk_of(job_id) is not None and valid_id(job_id):
            if (await self._chunks.cancel([job_id], tenant))[job_id] == -1:
                raise JobNotFound(job_id)
            return await self.get(job_id, tenant=tenant)
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
        return await self.get(job_id, tenant=tenant)

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


def _streams(kind: JobKind | str, body: dict[str, Any]) -> bool:
    """A chat body that asks for ``stream: true`` is a streamed job."""
    return kind == JobKind.chat and body.get("stream") is True


def _with_metadata(opts: JobOptions, request: Request) -> JobOptions:
    if len(request) < 3:
        return opts
    extra: dict[str, str] = request[2]  # type: ignore[misc]
    return opts.model_copy(update={"metadata": {**opts.metadata, **extra}})
