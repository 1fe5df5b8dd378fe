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

from .blocks import IN_ENVELOPE, ChunkHead, ResultBlock, block_field, locations, raw_bytes
from .chunks import attempts_field, chunk_item_id, metadata_field, result_field
from .envelope import JobResult
from .keys import Keys

_HEAD = ["n", "tenant", "kind", "created_at", "metadata", "x"]


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
    """One chunk as read: None where its record is missing (or is not a chunk record)."""

    head: ChunkHead | None
    n: int = 0
    results: list[Found] = field(default_factory=list)  # per index asked, in order
    attempts: list[int] = field(default_factory=list)


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


async def read_chunk_jobs(
    redis: Any, keys: Keys, wanted: Sequence[tuple[str, Sequence[int]]]
) -> list[ChunkJobs]:
    """For each (chunk id, indices): the chunk's head and each index's result and attempts.
    ``redis`` may decode responses (with ``surrogateescape``, as ``connect`` makes it) or not."""
    async with redis.pipeline(transaction=False) as pipe:
        for chunk_id, indices in wanted:
            fields = list(_HEAD)
            for i in indices:
                fields += [result_field(i), attempts_field(i), metadata_field(i)]
            pipe.hmget(keys.chunk(chunk_id), fields)
        replies = await pipe.execute(raise_on_error=False)
    out: list[ChunkJobs] = []
    blocks_wanted: dict[tuple[str, int], None] = {}
    places: list[list[int]] = []
    for (chunk_id, indices), reply in zip(wanted, replies, strict=True):
        if not isinstance(reply, list) or reply[0] is None:
            out.append(ChunkJobs(None))
            places.append([])
            continue
        n = int(reply[0])
        head = ChunkHead(
            chunk_id, _text(reply[2]) or "", _text(reply[1]) or "", float(reply[3]), _loads(reply[4])
        )
        where = locations(reply[5], n)
        jobs = ChunkJobs(head, n)
        spots = []
        for j, i in enumerate(indices):
            r, a = reply[6 + 3 * j], reply[7 + 3 * j]
            jobs.attempts.append(int(a or 0))
            k = int(where[i]) if 0 <= i < n else 0
            if k and k != IN_ENVELOPE:
                blocks_wanted[(chunk_id, k)] = None
                jobs.results.append(None)  # filled in below, from its block
                spots.append(j)
            else:
                jobs.results.append(_text(r) if r is not None else None)
        out.append(jobs)
        places.append(spots)
    if blocks_wanted:
        await _fill_rows(redis, keys, wanted, replies, out, places, list(blocks_wanted))
    return out


async def _fill_rows(
    redis: Any,
    keys: Keys,
    wanted: Sequence[tuple[str, Sequence[int]]],
    replies: list[Any],
    out: list[ChunkJobs],
    places: list[list[int]],
    needed: list[tuple[str, int]],
) -> None:
    """Put each job whose result is a block row in its place in ``out``."""
    async with redis.pipeline(transaction=False) as pipe:
        for chunk_id, k in needed:
            pipe.hget(keys.chunk(chunk_id), block_field(k))
        raw = await pipe.execute(raise_on_error=False)
    blocks = {
        key: ResultBlock.unpack(raw_bytes(value)) for key, value in zip(needed, raw, strict=True) if value
    }
    for (chunk_id, indices), reply, jobs, spots in zip(wanted, replies, out, places, strict=True):
        if jobs.head is None:
            continue
        where = locations(reply[5], jobs.n)
        for j in spots:
            index = indices[j]
            block = blocks.get((chunk_id, int(where[index])))
            if block is None:  # the record went between the two reads
                continue
            own = reply[8 + 3 * j]
            jobs.results[j] = BlockRow(
                chunk_item_id(chunk_id, index),
                block,
                block.row_of(index),
                jobs.head,
                _loads(own) if own is not None else None,
            )


def _loads(value: Any) -> dict[str, str]:
    return json.loads(value) if value else {}
