"""Client library: submit jobs to Redis, poll or wait for their results, stream them, cancel them.

Submissions are packed: items of the same kind, model and lane travel together in one arq
job (a *work package*), because arq's per-job overhead, not the GPU, would otherwise cap
throughput. ``submit_many`` packs what it is given; concurrent ``submit`` calls are packed
by the :class:`Coalescer`. Every item keeps its own id, record and result.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ..contract import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_LIMITS,
    DEFAULT_PACK_SIZE,
    LUA_CANCEL,
    LUA_COLLECT,
    LUA_SUBMIT,
    InvalidBody,
    JobKind,
    JobOptions,
    Keys,
    Limits,
    WorkItem,
    add_package,
    add_stream,
    connect,
    new_job_id,
    parse_body,
    request_fingerprint,
    trusted,
)
from ..errors import Conflict, OverspillError
from .arrays import Arrays
from .chunks import (
    ChunkReader,
    build_chunks,
    chunk_eligible,
    write_chunks,
)
from .coalescer import MAX_PACKAGE_BYTES, Coalescer, GroupKey, group_key, split
from .reading import Reading
from .records import record_args
from .replies import Replies

# Records written per script call (a submit_many of more goes out in several calls).
RECORDS_PER_CALL = 1000
# Deletes an idempotency claim only while it is still the one the submission made.
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


class Client(Reading, Arrays):
    """Async client. ``async with Client(url) as c: job = await c.submit("embed", body)``."""

    def __init__(
        self,
        redis_url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "overspill",
        limits: Limits = DEFAULT_LIMITS,
        pack_size: int = DEFAULT_PACK_SIZE,
        pack_bytes: int = MAX_PACKAGE_BYTES,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
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
        return await self.submit_with(kind, body, opts, validate=validate)

    async def submit_with(
        self, kind: JobKind | str, body: dict[str, Any], opts: JobOptions, *, validate: bool = True
    ) -> str:
        """:meth:`submit` with options that are a :class:`JobOptions` already (validated once, where made)."""
        item = self._item(kind, body, opts, time.time(), validate)
        claim = f"{item.id} {request_fingerprint(kind, body)}" if opts.idempotency_key else ""
        if opts.idempotency_key:
            existing = await self._claim_idempotency(opts.tenant, opts.idempotency_key, claim)
            if existing is not None:
                return existing
        try:
            if self._coalescer is not None:
                await self._coalescer.add(item)
            else:
                await self._enqueue_replying([item])
        except BaseException:
            if opts.idempotency_key:  # the key names only a job that was written
                await self._release_idempotency(opts.tenant, opts.idempotency_key, claim)
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
        # Every field below is validated already (the options, the kind): skip a second pass
        # (``trusted``: a quarter of ``model_construct``'s cost, which walks every field).
        return trusted(
            WorkItem,
            {
                "id": new_job_id(),
                "kind": JobKind(kind),
                "body": body,
                "tenant": opts.tenant,
                "lane": opts.lane,
                "created_at": now,
                "deadline_at": opts.deadline_at(now),
                "route": opts.route,
                "local_only": opts.local_only,
                "webhook": opts.webhook,
                "metadata": opts.metadata,
                "attempt": 0,
                "stream": True if opts.stream or _streams(kind, body) else None,
            },
        )

    async def _claim_idempotency(self, tenant: str, key: str, claim: str) -> str | None:
        """Claim ``key`` for ``claim`` (job id and request fingerprint); None if claimed now, else
        the job that holds it. The same key with another request is a :class:`Conflict`: answering
        it with the first request's job would hand one caller another request's result."""
        idem = self.keys.idempotency(tenant, key)
        if await self.redis.set(idem, claim, nx=True, ex=self.result_ttl_s):
            return None
        held = await self.redis.get(idem)
        if held is None:
            return None  # expired in between: this submission goes ahead unclaimed, as before
        job_id, _, fingerprint = str(held).partition(" ")
        if fingerprint and fingerprint != claim.partition(" ")[2]:  # a claim from before: job id only
            raise Conflict(
                f"Idempotency-Key {key!r} was used for a different request ({job_id})",
                code="idempotency_key_reused",
                param="Idempotency-Key",
            )
        return job_id

    async def _release_idempotency(self, tenant: str, key: str, claim: str) -> None:
        with contextlib.suppress(RedisError, OSError):  # unreachable: the claim expires with its TTL
            await self._release_claim(keys=[self.keys.idempotency(tenant, key)], args=[claim])

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
        for (_, _, lane, _), group in groups.items():
            for package in split(group, self.pack_size, self.pack_bytes):
                add_package(pipe, self.keys, package, lane)


def _streams(kind: JobKind | str, body: dict[str, Any]) -> bool:
    """A chat body that asks for ``stream: true`` is a streamed job."""
    return kind == JobKind.chat and body.get("stream") is True


def _with_metadata(opts: JobOptions, request: Request) -> JobOptions:
    if len(request) < 3:
        return opts
    extra: dict[str, str] = request[2]  # type: ignore[misc]
    return opts.model_copy(update={"metadata": {**opts.metadata, **extra}})
