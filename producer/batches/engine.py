"""Batches: the OpenAI Batch API's semantics over overspill's jobs.

A batch turns an uploaded JSONL file (:mod:`producer.batches.files`) into jobs on the ``bulk`` lane,
follows them, and writes an output file and an error file in the OpenAI formats
(:mod:`producer.batches.lines`). Statuses, as OpenAI's::

    validating ─┬─▶ failed                                   (the file is invalid)
                └─▶ in_progress ─┬─▶ finalizing ─▶ completed (every request finished)
                                 └─▶ expired                 (the window passed first)
    validating | in_progress ─▶ cancelling ─▶ cancelled       (queued jobs cancelled,
                                                               finished results kept)

State lives in Redis (keys in :class:`producer.contract.Keys`): the batch hash (status, ``*_at``,
counts, submission progress), and a list with one entry per request line, in input order,
``[custom_id, job_id, error]``. A batch is driven by *steps* (:meth:`BatchEngine.step`), each
under a lease (a Redis key with a TTL) so that one driver at a time works on a batch:

- validating: stream the file once, checking every line; any file-level problem fails it.
- in_progress: submit the requests in chunks (``batch_chunk_lines`` per Redis transaction,
  packed ``batch_pack_size`` items per arq job). Each chunk's jobs, its line entries and the
  new count of submitted lines (and byte offset in the file) commit in *one* MULTI, so a
  driver that dies mid-submission resumes exactly after the last committed chunk: no line
  is lost or submitted twice. Then count job states (one Lua call per 1 000 jobs, from a
  persisted cursor below which every job is known finished).
- finalizing (or cancelling / expiring): stream through the entries in order and write the
  two files from scratch into ``.part`` files, rename them, then switch the status in one
  transition. A crash while finalising just redoes it: exactly one line per custom_id.

Who drives: a :class:`BatchDriver` task in each API process wakes every ``batch_poll_s``
(and at once on create, cancel, or a ``GET`` of the batch), lists the active batches (a Redis
set, so a restarted API resumes every unfinished batch) and steps each one not already being
stepped. Several API processes may run drivers; the lease keeps them off each other. The
``overspill bulk --redis-url`` command drives its own batch the same way, with no API.

Status changes go through one compare-and-set script, so a cancel racing a driver's
transition never loses either. Batch jobs are not counted against a tenant's
interactive queued-jobs limit (``max_queued``): a batch is bounded by its line limit instead.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

import structlog

from ..client import Client
from ..contract import DEFAULT_LIMITS, Lane, Limits, valid_id
from ..errors import ApiError, Conflict, NotFound
from .lease import Lease
from .lines import (
    ENDPOINT_KINDS,
    Entry,
    Prepared,
    read_chunk,
    validate_file,
)
from .outputs import append, finish
from .progress import ProgressCounter
from .state import (
    ACTIVE,
    LUA_RELEASE,
    LUA_RENEW,
    PAGE,
    BatchSettings,
    BatchState,
    BatchStatus,
)
from .store import BatchStore

log = structlog.get_logger("producer.batches")


class BatchEngine:
    """Create, read, cancel and drive batches. Shares the :class:`Client`'s Redis."""

    def __init__(self, settings: BatchSettings, client: Client, limits: Limits = DEFAULT_LIMITS) -> None:
        self.settings = settings
        self.client = client
        self.limits = limits
        self.redis = client.redis
        self.keys = client.keys
        self.store = BatchStore.for_settings(self.redis, self.keys, settings)
        self.files = self.store.files
        self.transition = self.store.transition
        self.counter = ProgressCounter(self.store)
        self._renew = self.redis.register_script(LUA_RENEW)
        self._release = self.redis.register_script(LUA_RELEASE)

    # ------------------------------------------------------------------ API

    async def create(
        self,
        tenant: str,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Register a batch (status ``validating``); a driver takes it from there."""
        if endpoint not in ENDPOINT_KINDS:
            raise ApiError(
                f"endpoint must be one of {', '.join(ENDPOINT_KINDS)}", param="endpoint", code="invalid_value"
            )
        window = self.settings.batch_windows.get(completion_window)
        if window is None:
            allowed = ", ".join(repr(w) for w in self.settings.batch_windows)
            raise ApiError(
                f"completion_window must be {allowed}", param="completion_window", code="invalid_value"
            )
        _check_metadata(metadata)
        batch_id = "batch_" + secrets.token_hex(12)
        # The batch commits with its claim on the file: a file deleted meanwhile is a 404.
        async with self.files.claim(tenant, input_file_id, batch_id) as (source, pipe):
            if source.purpose != "batch":
                raise ApiError(
                    "the input file's purpose must be 'batch'", param="input_file_id", code="invalid_value"
                )
            now = time.time()
            state = BatchState(
                id=batch_id,
                tenant=tenant,
                endpoint=endpoint,
                input_file_id=input_file_id,
                completion_window=completion_window,
                status=BatchStatus.validating,
                created_at=now,
                expires_at=now + window,
                out_file="file-" + secrets.token_hex(12),
                err_file="file-" + secrets.token_hex(12),
                metadata=json.dumps(metadata) if metadata else None,
            )
            pipe.hset(self.keys.batch(state.id), mapping=state.model_dump(mode="json", exclude_none=True))
            pipe.zadd(self.keys.batches(tenant), {state.id: now})
            pipe.sadd(self.keys.active_batches(), state.id)
        log.info("batch created", batch_id=state.id, tenant=tenant, endpoint=endpoint, file_id=input_file_id)
        return state.public()

    async def get(self, tenant: str, batch_id: str) -> dict[str, Any]:
        return (await self._owned(tenant, batch_id)).public()

    async def list(self, tenant: str, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        """The tenant's batches, newest first, ``limit`` after the batch ``after``."""
        key = self.keys.batches(tenant)
        start = 0
        if after:
            rank = await self.redis.zrevrank(key, after)
            start = 0 if rank is None else int(rank) + 1
        ids: list[str] = await self.redis.zrevrange(key, start, start + limit)
        async with self.redis.pipeline(transaction=False) as pipe:
            for batch_id in ids[:limit]:
                pipe.hgetall(self.keys.batch(batch_id))
            raws = await pipe.execute()
        data = [BatchState.model_validate(r).public() for r in raws if r]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(ids) > limit,
        }

    async def cancel(self, tenant: str, batch_id: str) -> dict[str, Any]:
        """Ask for cancellation: ``cancelling`` now, ``cancelled`` once running jobs finish."""
        state = await self._owned(tenant, batch_id)
        cancellable = f"{BatchStatus.validating},{BatchStatus.in_progress}"
        fields = ["status", BatchStatus.cancelling.value, "cancelling_at", repr(time.time())]
        if not await self.transition(keys=[self.keys.batch(batch_id)], args=[cancellable, *fields]):
            state = await self._owned(tenant, batch_id)
            # Asking again while it cancels is idempotent; a cancelled batch has ended (409).
            if state.status != BatchStatus.cancelling:
                raise Conflict(
                    f"Cannot cancel a batch with status '{state.status.value}'.", code="batch_not_cancellable"
                )
            return state.public()
        log.info("batch cancelling", batch_id=batch_id, was=state.status.value)
        return (await self._owned(tenant, batch_id)).public()

    async def step_failed(self, batch_id: str, error: BaseException) -> bool:
        """Count a crashed step; past ``batch_max_step_failures`` in a row, fail the batch.

        A step that crashes on the same input every time would otherwise be retried for ever.
        True if the batch was failed now. Its queued jobs are cancelled, finished ones kept.
        """
        key = self.keys.batch(batch_id)
        crashes = int(await self.redis.hincrby(key, "step_failures", 1))
        if crashes < self.settings.batch_max_step_failures:
            return False
        state = await self.load(batch_id)
        if state is None or state.status not in ACTIVE:
            return False
        message = f"the batch could not be processed ({type(error).__name__}); {crashes} attempts failed"
        errors = json.dumps([{"code": "processing_error", "message": message, "param": None, "line": None}])
        fields = ["status", "failed", "failed_at", repr(time.time()), "errors", errors]
        if not await self.transition(keys=[key], args=[",".join(sorted(ACTIVE)), *fields]):
            return False
        await self._cancel_jobs(state)
        await self.redis.srem(self.keys.active_batches(), batch_id)
        log.error("batch failed: its steps keep crashing", batch_id=batch_id, crashes=crashes)
        return True

    async def active(self) -> list[str]:
        return sorted(await self.redis.smembers(self.keys.active_batches()))

    # ------------------------------------------------------------------ driving

    async def step(self, batch_id: str) -> BatchStatus | None:
        """Advance a batch as far as it goes now; None if another driver holds it."""
        token = secrets.token_hex(8)
        key = self.keys.batch_lease(batch_id)
        if not await self.redis.set(key, token, nx=True, px=int(self.settings.batch_lease_s * 1000)):
            return None
        lease = Lease(key, token, self.settings.batch_lease_s, self._renew, self._release)
        try:
            status = await self._advance(batch_id, lease)
        finally:
            await lease.release()
        await self.redis.hdel(self.keys.batch(batch_id), "step_failures")  # a clean step resets the count
        return status

    async def _advance(self, batch_id: str, lease: Lease) -> BatchStatus | None:
        state = await self.load(batch_id)
        if state is not None and state.status == BatchStatus.validating:
            state = await self._validate(state)
        if state is not None and state.status == BatchStatus.in_progress:
            state = await self._run(state, lease)
        if state is not None and state.status == BatchStatus.cancelling:
            state = await self._wind_down(state, lease)
        if state is not None and state.status == BatchStatus.finalizing:
            state = await finish(self.store, state, lease, "completed", BatchStatus.finalizing)
        if state is None or state.status not in ACTIVE:
            await self.redis.srem(self.keys.active_batches(), batch_id)
        return state.status if state is not None else None

    async def _validate(self, state: BatchState) -> BatchState | None:
        path = self.files.path(state.input_file_id)
        s = self.settings
        v = await asyncio.to_thread(
            validate_file, path, state.endpoint, max_lines=s.batch_max_lines, max_inputs=s.batch_max_inputs
        )
        now = repr(time.time())
        if v.errors:
            errors = json.dumps([e.model_dump() for e in v.errors])
            fields = ["status", "failed", "failed_at", now, "errors", errors, "total", str(v.total)]
            log.info("batch failed validation", batch_id=state.id, errors=len(v.errors) + v.dropped)
        else:
            fields = ["status", "in_progress", "in_progress_at", now, "total", str(v.total)]
            log.info("batch validated", batch_id=state.id, requests=v.total)
        await self.transition(keys=[self.keys.batch(state.id)], args=["validating", *fields])
        return await self.load(state.id)

    async def _run(self, state: BatchState, lease: Lease) -> BatchState | None:
        if time.time() >= state.expires_at:
            return await self._expire(state, lease)
        if state.submitted < state.total:
            await self._submit(state, lease)
        current = await self.load(state.id)
        if current is None or current.status != BatchStatus.in_progress:
            return current
        current = await self.counter.count(current)
        current = await append(self.store, current, lease, current.scan_at)  # results leave Redis
        if current.submitted >= current.total and current.scan_at >= current.total:
            fields = ["status", "finalizing", "finalizing_at", repr(time.time())]
            await self.transition(keys=[self.keys.batch(state.id)], args=["in_progress", *fields])
            return await self.load(state.id)
        return current

    async def _submit(self, state: BatchState, lease: Lease) -> None:
        """Submit the remaining lines, one chunk per transaction, until done or cancelled."""
        kind = ENDPOINT_KINDS[state.endpoint]
        path = self.files.path(state.input_file_id)
        submitted, offset = state.submitted, state.offset
        limit = min(state.total, state.written_at + self.settings.batch_window_lines)
        chunks = 0
        while submitted < limit and chunks <= state.total:
            chunks += 1
            await lease.renew()
            if await self.redis.hget(self.keys.batch(state.id), "status") != BatchStatus.in_progress:
                return
            count = min(self.settings.batch_chunk_lines, limit - submitted)
            prepared, next_offset = await asyncio.to_thread(
                read_chunk, path, offset, count, kind, self.limits
            )
            if not prepared:
                log.error("input file shorter than validated", batch_id=state.id, submitted=submitted)
                return
            await self._submit_chunk(state, prepared, submitted + len(prepared), next_offset)
            submitted, offset = submitted + len(prepared), next_offset
        log.info("batch lines submitted", batch_id=state.id, submitted=submitted, total=state.total)

    async def _submit_chunk(
        self, state: BatchState, prepared: list[Prepared], submitted: int, offset: int
    ) -> None:
        kind = ENDPOINT_KINDS[state.endpoint]
        requests = [(kind, p.body, {"custom_id": p.custom_id}) for p in prepared if p.body is not None]

        def record(pipe: Any, job_ids: list[str]) -> None:
            ids = iter(job_ids)
            entries = [
                Entry(p.custom_id, next(ids) if p.body is not None else None, p.error).encode()
                for p in prepared
            ]
            pipe.rpush(self.keys.batch_lines(state.id), *entries)
            pipe.hset(self.keys.batch(state.id), mapping={"submitted": submitted, "offset": offset})

        await self.client.submit_many(
            requests,
            validate=False,
            also=record,
            lane=Lane.bulk,
            deadline=state.expires_at,
            tenant=state.tenant,
            metadata={"batch_id": state.id},
        )

    async def entries(self, batch_id: str, start: int, stop: int) -> list[Entry]:
        return await self.store.entries(batch_id, start, stop)

    async def _expire(self, state: BatchState, lease: Lease) -> BatchState | None:
        await self._cancel_jobs(state)
        return await finish(self.store, state, lease, "expired", BatchStatus.in_progress)

    async def _wind_down(self, state: BatchState, lease: Lease) -> BatchState | None:
        """Cancelling: cancel the queued jobs once, wait for running ones (bounded), finish."""
        if not state.cancel_sent:
            await self._cancel_jobs(state)
            await self.redis.hset(self.keys.batch(state.id), "cancel_sent", 1)
        state = await self.counter.count(state)
        state = await append(self.store, state, lease, state.scan_at)
        waited = time.time() - (state.cancelling_at or time.time())
        if state.scan_at < state.submitted and waited < self.settings.batch_cancel_grace_s:
            return state
        return await finish(self.store, state, lease, "cancelled", BatchStatus.cancelling)

    async def _cancel_jobs(self, state: BatchState) -> None:
        cancelled = 0
        for start in range(state.written_at, state.submitted, PAGE):  # those below are on disk
            entries = await self.entries(state.id, start, min(start + PAGE, state.submitted))
            ids = [e.job_id for e in entries if e.job_id]
            cancelled += await self.client.cancel_many(ids, tenant=state.tenant)
        log.info("batch jobs cancelled", batch_id=state.id, cancelled=cancelled)

    # ------------------------------------------------------------------ state

    async def load(self, batch_id: str) -> BatchState | None:
        return await self.store.load(batch_id)

    async def _owned(self, tenant: str, batch_id: str) -> BatchState:
        state = await self.load(batch_id) if valid_id(batch_id) else None
        if state is None or state.tenant != tenant:
            raise NotFound(f"No batch found with id '{batch_id}'.", code="batch_not_found", param="batch_id")
        return state


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > 16:
        raise ApiError("metadata holds at most 16 pairs", param="metadata", code="invalid_value")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            raise ApiError(
                "metadata keys are strings of at most 64 characters, values strings of at most 512",
                param="metadata",
                code="invalid_value",
            )
