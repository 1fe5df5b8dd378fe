"""Bulk chunks on the client's side: write them, read their jobs' envelopes, cancel their jobs.

A bulk ``submit_many`` without webhooks or streams writes its jobs as chunks (see
``producer/contract/chunks.py``): one record and one work package per chunk of up to
``chunk_size`` jobs of the same kind and model. Readers fetch a chunk's finished envelopes with
two pipelined reads (``contract/chunk_reads.py``); there is no done list to block on, so waiting on a chunk's job polls at an
interval that grows to ``MAX_POLL_S``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from ..contract import (
    LUA_CHUNK_CANCEL,
    OWN_METADATA_FIELD,
    BlockRow,
    ErrorInfo,
    JobKind,
    JobOptions,
    JobResult,
    Keys,
    Limits,
    Status,
    check_body,
    chunk_item_id,
    chunk_of,
    dumps,
    group_by_chunk,
    loads,
    metadata_field,
    new_chunk_id,
    queue_payload,
    read_chunk_jobs,
    read_result,
)
from ..errors import JobNotFound
from .coalescer import body_bytes
from .records import RECORD_GRACE_S

# Waiting on one job of a chunk: poll its field, first after MIN_POLL_S, then at doubling intervals.
MIN_POLL_S = 0.02
MAX_POLL_S = 0.5
# Jobs whose fields one pipelined read asks for (a reader's pass is one round trip per this many).
READ_JOBS = 4000


@dataclass(slots=True)
class Chunk:
    """One chunk being built: its package header, ``[index, body(, metadata)]`` entries and
    the fields of its record."""

    id: str
    header: dict[str, Any]
    entries: list[list[Any]] = field(default_factory=list)
    own_metadata: dict[str, str] = field(default_factory=dict)  # record field → JSON
    bytes: int = 0


def chunk_eligible(opts: JobOptions) -> bool:
    """May a submission with ``opts`` be written as chunks? Bulk jobs nobody waits on one by one:
    no webhook, no stream (those need a record per job)."""
    return opts.lane.value == "bulk" and opts.webhook is None and not opts.stream


def build_chunks(
    requests: Iterable[Sequence[Any]],
    opts: JobOptions,
    now: float,
    *,
    size: int,
    max_bytes: int,
    limits: Limits,
    validate: bool,
) -> tuple[list[str], list[Chunk]]:
    """Job ids in request order, and the chunks holding them (grouped by kind and model)."""
    base = {
        "tenant": opts.tenant,
        "lane": opts.lane.value,
        "created_at": now,
        "deadline_at": opts.deadline_at(now),
        "route": opts.route,
        "local_only": opts.local_only,
        "metadata": opts.metadata,
    }
    open_chunks: dict[tuple[str, str], Chunk] = {}
    done: list[Chunk] = []
    ids: list[str] = []
    for request in requests:
        body = request[1]
        if validate:
            check_body(request[0], body, limits)
        kind = JobKind(request[0])
        n = body_bytes(body)
        group = (kind.value, str(body.get("model", "")) if isinstance(body, dict) else "")
        chunk = open_chunks.get(group)
        if chunk is not None and (len(chunk.entries) >= size or chunk.bytes + n > max_bytes):
            done.append(chunk)
            chunk = None
        if chunk is None:
            chunk = open_chunks[group] = Chunk(new_chunk_id(), {**base, "kind": kind.value})
            chunk.header["id"] = chunk.id
        index = len(chunk.entries)
        entry: list[Any] = [index, body]
        if len(request) > 2 and request[2]:
            metadata = {**opts.metadata, **request[2]}
            entry.append(metadata)
            chunk.own_metadata[metadata_field(index)] = dumps(metadata)
        chunk.entries.append(entry)
        chunk.bytes += n
        ids.append(chunk_item_id(chunk.id, index))
    return ids, done + list(open_chunks.values())


def write_chunks(pipe: Any, keys: Keys, chunks: Sequence[Chunk], result_ttl_s: int) -> None:
    """Each chunk's record and work package, added to ``pipe`` (a transaction)."""
    for chunk in chunks:
        h = chunk.header
        ttl = int(h["deadline_at"] - h["created_at"] + RECORD_GRACE_S + result_ttl_s)
        record: dict[str, Any] = {
            "kind": h["kind"],
            "tenant": h["tenant"],
            "lane": h["lane"],
            "created_at": repr(h["created_at"]),
            "n": len(chunk.entries),
            **chunk.own_metadata,
        }
        if chunk.own_metadata:
            record[OWN_METADATA_FIELD] = len(chunk.own_metadata)
        if h["metadata"]:
            record["metadata"] = dumps(h["metadata"])
        key = keys.chunk(chunk.id)
        pipe.hset(key, mapping=record)
        pipe.expire(key, ttl)
        payload = {"chunk": h, "entries": chunk.entries}
        n = len(chunk.entries)
        queue_payload(pipe, keys, payload, h["lane"], h["deadline_at"], tenant=h["tenant"], items=n)


def by_chunk(job_ids: Iterable[str]) -> dict[str, list[tuple[str, int]]]:
    """Chunk id → its jobs among ``job_ids``, as (job id, index)."""
    ids = list(job_ids)
    plain, chunks = group_by_chunk(ids)
    if plain:
        raise ValueError(f"{ids[plain[0]]} is not a job of a chunk")
    return {chunk_id: [(ids[p], i) for p, i in members] for chunk_id, members in chunks.items()}


class ChunkReader:
    """Reads and cancels jobs of chunks: one command per chunk, not one per job."""

    def __init__(self, redis: Any, keys: Keys, result_ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.result_ttl_s = result_ttl_s
        self._cancel = redis.register_script(LUA_CHUNK_CANCEL)

    async def get(self, job_id: str, tenant: str | None) -> JobResult:
        """The job's current envelope; :class:`JobNotFound` if unknown or another tenant's."""
        chunk_id, index = chunk_of(job_id) or ("", -1)
        (jobs,) = await read_chunk_jobs(self.redis, self.keys, [(chunk_id, [index])], attempts=True)
        head = jobs.head
        if head is None or index >= jobs.n or (tenant is not None and head.tenant != tenant):
            raise JobNotFound(job_id)
        found = jobs.results[0]
        if isinstance(found, BlockRow):
            return found.envelope()
        if found is not None:
            return read_result(found)
        own = await self.redis.hget(self.keys.chunk(chunk_id), metadata_field(index))
        return JobResult(
            id=job_id,
            kind=JobKind(head.kind),
            status=Status.running if jobs.attempts[0] else Status.queued,
            tenant=head.tenant,
            attempts=jobs.attempts[0],
            created_at=head.created_at,
            metadata=loads(own) if own else head.metadata,
        )

    async def take_finished(
        self, pending: dict[str, list[tuple[str, int]]], tenant: str | None, seen: dict[str, int]
    ) -> list[tuple[str, str | BlockRow]]:
        """(job id, envelope JSON or block row) of the terminal jobs among ``pending`` (chunk id
        → (job id, index)), which are taken out of it; a job that does not exist (or is another
        tenant's) raises :class:`JobNotFound`. The caller makes each envelope when it hands it on.

        A pass reads each chunk's counters (tenant, jobs, terminal jobs) and asks for the
        results only of chunks whose terminal count moved since ``seen`` (chunk id → count,
        kept by the caller between passes): a pass over chunks still running costs three
        fields each, not one per pending job.
        """
        groups = list(pending.items())
        async with self.redis.pipeline(transaction=False) as pipe:
            for chunk_id, _ in groups:
                pipe.hmget(self.keys.chunk(chunk_id), ["tenant", "n", "d"])
            counters = await pipe.execute(raise_on_error=False)
        moved = []
        for (chunk_id, members), reply in zip(groups, counters, strict=True):
            self._check(members, reply, tenant)
            done = int(reply[2] or 0)
            if done > seen.get(chunk_id, -1):
                seen[chunk_id] = done
                moved.append((chunk_id, members))
        out: list[tuple[str, str | BlockRow]] = []
        for page in self._pages(moved):
            wanted = [(chunk_id, [i for _, i in members]) for chunk_id, members in page]
            read = await read_chunk_jobs(self.redis, self.keys, wanted)
            for (chunk_id, members), jobs in zip(page, read, strict=True):
                if jobs.head is None:  # the chunk's record went between the two reads
                    raise JobNotFound(members[0][0])
                left = []
                for member, found in zip(members, jobs.results, strict=True):
                    if found is None:
                        left.append(member)
                    else:
                        out.append((member[0], found))
                if left:
                    pending[chunk_id] = left
                else:
                    del pending[chunk_id]
                    seen.pop(chunk_id, None)
        return out

    @staticmethod
    def _pages(
        groups: list[tuple[str, list[tuple[str, int]]]],
    ) -> Iterator[list[tuple[str, list[tuple[str, int]]]]]:
        """``groups`` cut into pipelines of about ``READ_JOBS`` jobs."""
        start = 0
        while start < len(groups):
            first, jobs = start, 0
            while start < len(groups) and (start == first or jobs + len(groups[start][1]) <= READ_JOBS):
                jobs += len(groups[start][1])
                start += 1
            yield groups[first:start]

    @staticmethod
    def _check(members: list[tuple[str, int]], reply: Any, tenant: str | None) -> None:
        """Raise :class:`JobNotFound` unless the counters in ``reply`` show a chunk of
        ``tenant`` holding every one of ``members``."""
        if not isinstance(reply, list) or reply[1] is None or (tenant is not None and reply[0] != tenant):
            raise JobNotFound(members[0][0])
        n = int(reply[1])
        for job_id, index in members:
            if index >= n:
                raise JobNotFound(job_id)

    async def cancel(self, job_ids: Sequence[str], tenant: str) -> dict[str, int]:
        """Cancel the queued ones of ``job_ids``. Per job: 1 cancelled, 0 already terminal,
        2 running (left alone), -1 not found."""
        outcomes: dict[str, int] = {}
        now = time.time()
        error = ErrorInfo(type="cancelled", message="cancelled by the producer")
        for chunk_id, members in by_chunk(job_ids).items():
            key = self.keys.chunk(chunk_id)
            try:
                owner, kind, created, metadata, *own = await self.redis.hmget(
                    key,
                    ["tenant", "kind", "created_at", "metadata", *(metadata_field(i) for _, i in members)],
                )
            except ResponseError:
                owner = None
            if owner != tenant or kind not in JobKind._value2member_map_:
                outcomes.update((job_id, -1) for job_id, _ in members)
                continue
            args: list[Any] = [tenant, self.result_ttl_s]
            for (job_id, index), extra in zip(members, own, strict=True):
                envelope = JobResult(
                    id=job_id,
                    kind=JobKind(kind),
                    status=Status.cancelled,
                    tenant=tenant,
                    created_at=float(created),
                    finished_at=now,
                    error=error,
                    metadata=loads(extra or metadata or "{}"),
                )
                args += [index, envelope.model_dump_json(exclude_none=True)]
            flags = await self._cancel(keys=[key], args=args)
            outcomes.update((job_id, int(f)) for (job_id, _), f in zip(members, flags, strict=True))
        return outcomes
