"""Reading jobs of bulk chunks: each job's result, from its envelope field or its block's row.

One reader for every place that reads them (the client's ``get`` and ``iter_results``, its
arrays, the Batch API's output): two pipelined round trips for any number of chunks, one for
the records' counters and the fields of the jobs asked for, one for the blocks those jobs'
rows are in (each block read and taken apart once, however many of its rows are wanted).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .blocks import (
    IN_ENVELOPE,
    OWN_METADATA_FIELD,
    ChunkHead,
    ResultBlock,
    attempts_map,
    block_field,
    locations,
)
from .chunks import chunk_item_id, metadata_field, result_field
from .envelope import JobResult
from .keys import Keys

_HEAD = ["n", "tenant", "kind", "created_at", "metadata", "x", OWN_METADATA_FIELD, "y"]


@dataclass(slots=True)
class BlockRow:
    """A job's result as a row of a block: its envelope is made only when asked for."""

    job_id: str
    block: ResultBlock
    row: int
    chunk: ChunkHead
    metadata: dict[str, str] | None = None  # the job's own, where it has one

    def envelope(self) -> JobResult:
        return self.block.envelope(self.row, self.chunk, self.metadata)


# A job's state as read: None (queued or running), its envelope JSON, or its block row.
Found = str | BlockRow | None


@dataclass(slots=True)
class ChunkJobs:
    """One chunk as read: ``head`` None where its record is missing (or is not a chunk record)."""

    head: ChunkHead | None
    n: int = 0
    results: list[Found] = field(default_factory=list)  # per index asked, in order
    attempts: list[int] = field(default_factory=list)  # per index asked, if asked for


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


async def read_chunk_jobs(
    redis: Any, keys: Keys, wanted: Sequence[tuple[str, Sequence[int]]], *, attempts: bool = False
) -> list[ChunkJobs]:
    """For each (chunk id, indices): the chunk's head and each index's result (and attempts).

    The first round trip reads each record's head and location map (and the attempts); the
    second the envelope fields, the blocks (undecoded: they are bytes) and the jobs' own
    metadata, only where a record says some job has its own."""
    async with redis.pipeline(transaction=False) as pipe:
        for chunk_id, _ in wanted:
            pipe.hmget(keys.chunk(chunk_id), _HEAD)
        replies = await pipe.execute(raise_on_error=False)
    out: list[ChunkJobs] = []
    plans: list[_Plan | None] = []
    for (chunk_id, indices), reply in zip(wanted, replies, strict=True):
        if not isinstance(reply, list) or reply[0] is None:
            out.append(ChunkJobs(None))
            plans.append(None)
            continue
        n = int(reply[0])
        head = ChunkHead(
            chunk_id, _text(reply[2]) or "", _text(reply[1]) or "", float(reply[3]), _loads(reply[4])
        )
        jobs = ChunkJobs(head, n, [None] * len(indices))
        if attempts:
            tries = attempts_map(reply[7], n)
            jobs.attempts = [int(tries[i]) if 0 <= i < n else 0 for i in indices]
        out.append(jobs)
        plans.append(_Plan.of(indices, locations(reply[5], n), bool(reply[6])))
    if any(p is not None and p.reads for p in plans):
        await _second_read(redis, keys, wanted, out, plans)
    return out


@dataclass(slots=True)
class _Plan:
    """What the second read fetches for one chunk."""

    envelopes: list[int]  # positions (among the indices asked) whose envelope is a field
    rows: list[tuple[int, int]]  # (position, block number) of those in blocks
    own: bool  # some job of the chunk has metadata of its own

    @classmethod
    def of(cls, indices: Sequence[int], where: Any, own: bool) -> _Plan:
        envelopes, rows = [], []
        n = len(where)
        for j, i in enumerate(indices):
            k = int(where[i]) if 0 <= i < n else 0
            if k == IN_ENVELOPE:
                envelopes.append(j)
            elif k:
                rows.append((j, k))
        return cls(envelopes, rows, own)

    @property
    def reads(self) -> bool:
        return bool(self.envelopes or self.rows)


async def _second_read(
    redis: Any,
    keys: Keys,
    wanted: Sequence[tuple[str, Sequence[int]]],
    out: list[ChunkJobs],
    plans: list[_Plan | None],
) -> None:
    """Envelope fields, blocks and own metadata, in one pipeline; results put in place."""
    async with redis.pipeline(transaction=False) as pipe:
        for (chunk_id, indices), plan in zip(wanted, plans, strict=True):
            if plan is None or not plan.reads:
                continue
            key = keys.chunk(chunk_id)
            fields = [result_field(indices[j]) for j in plan.envelopes]
            if plan.own:
                fields += [metadata_field(indices[j]) for j, _ in plan.rows]
            if fields:
                pipe.hmget(key, fields)
            for k in dict.fromkeys(k for _, k in plan.rows):
                pipe.execute_command("HGET", key, block_field(k), NEVER_DECODE=True)  # bytes as stored
        replies = iter(await pipe.execute(raise_on_error=False))
    for (chunk_id, indices), plan, jobs in zip(wanted, plans, out, strict=True):
        if plan is None or not plan.reads or jobs.head is None:
            continue
        got = next(replies) if plan.envelopes or (plan.own and plan.rows) else []
        got = got if isinstance(got, list) else []
        for j, value in zip(plan.envelopes, got, strict=False):
            jobs.results[j] = _text(value)
        owns = got[len(plan.envelopes) :] if plan.own else []
        blocks = {}
        for k in dict.fromkeys(k for _, k in plan.rows):
            raw = next(replies)
            if isinstance(raw, bytes):
                blocks[k] = ResultBlock.unpack(raw)
        for r, (j, k) in enumerate(plan.rows):
            block = blocks.get(k)
            if block is None:  # the record went between the two reads
                continue
            own = owns[r] if r < len(owns) else None
            jobs.results[j] = BlockRow(
                chunk_item_id(chunk_id, indices[j]),
                block,
                block.row_of(indices[j]),
                jobs.head,
                _loads(own) if own is not None else None,
            )


def _loads(value: Any) -> dict[str, str]:
    return json.loads(value) if value else {}
