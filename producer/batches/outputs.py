"""A batch's output and error files: appended as its lines finish, then published.

While a batch runs, every step appends the newly finished prefix of its lines to ``.part``
files and deletes those lines' job records, or their fields in their bulk chunks (:func:`append`),
so results never pile up in Redis
until the end. Finishing appends the rest, renames the files to their final names and switches
the status in one transition; a crash at any point is redone from the recorded sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from ..contract import (
    BlockRow,
    ChunkJobs,
    chunk_of,
    group_by_chunk,
    metadata_field,
    read_chunk_jobs,
    result_field,
)
from .files import FileRecord
from .lease import Lease
from .lines import Entry, write_page, write_unsubmitted
from .state import PAGE, BatchState, BatchStatus
from .store import BatchStore


class BatchFilesLost(RuntimeError):
    """A batch's partial output is not where its record says: its steps fail (then the batch)."""


log = structlog.get_logger("producer.batches")

# A chunk's count of jobs the batch wrote out and removed from it: at its ``n``, it goes.
WRITTEN_FIELD = "w"
# An envelope's status: its third field (after id and kind), well within its first 512 bytes.
STATUS_IN_ENVELOPE = re.compile(r'"status":"([a-z]+)"')


async def finish(
    store: BatchStore, state: BatchState, lease: Lease, outcome: str, current: BatchStatus
) -> BatchState | None:
    """Write the output and error files from scratch, then switch to the final status."""
    started = time.perf_counter()
    n_out, n_err = await _write_files(store, state, lease, outcome)
    now = repr(time.time())
    final = {
        "completed": BatchStatus.completed,
        "cancelled": BatchStatus.cancelled,
        "expired": BatchStatus.expired,
    }[outcome]
    fields = [
        "status",
        final.value,
        f"{final.value}_at",
        now,
        "completed",
        str(n_out),
        "failed",
        str(n_err),
    ]
    fields += ["total", str(max(state.total, n_out + n_err))]
    async with store.redis.pipeline(transaction=True) as pipe:
        for file_id, count, kind in ((state.out_file, n_out, "output"), (state.err_file, n_err, "error")):
            if count:
                fields += [f"{kind}_file_id", file_id]
                store.files.register(pipe, _output_record(store, state, file_id, kind))
        await pipe.execute()
    if await store.transition(keys=[store.keys.batch(state.id)], args=[current.value, *fields]):
        await store.redis.delete(store.keys.batch_lines(state.id))
        log.info(
            "batch finished",
            batch_id=state.id,
            status=final.value,
            output=n_out,
            errors=n_err,
            write_ms=round((time.perf_counter() - started) * 1000),
        )
    return await store.load(state.id)


def _output_record(store: BatchStore, state: BatchState, file_id: str, kind: str) -> FileRecord:
    return FileRecord(
        id=file_id,
        tenant=state.tenant,
        bytes=store.files.path(file_id).stat().st_size,
        created_at=int(time.time()),
        filename=f"{state.id}_{kind}.jsonl",
        purpose="batch_output",
    )


async def append(
    store: BatchStore, state: BatchState, lease: Lease, upto: int, outcome: str = "completed"
) -> BatchState:
    """Entries ``written_at`` .. ``upto`` into the ``.part`` files, a page at a time.

    After each page the batch records how far its files go (entries and bytes), then deletes
    the page's job records: results leave Redis as soon as they are on disk, so a batch holds
    in Redis only its lines in flight. A crash between the write and the record is undone on
    the next append, which first cuts each file back to its recorded size.
    """
    if upto <= state.written_at:
        return state
    out_part, err_part = store.files.part_path(state.out_file), store.files.part_path(state.err_file)
    _rewind(out_part, state.out_bytes)
    _rewind(err_part, state.err_bytes)
    done = {
        "written_at": state.written_at,
        "out_bytes": state.out_bytes,
        "err_bytes": state.err_bytes,
        "written_out": state.written_out,
        "written_err": state.written_err,
    }
    with open(out_part, "a", encoding="utf-8") as out, open(err_part, "a", encoding="utf-8") as err:
        for start in range(state.written_at, upto, PAGE):
            await lease.renew()
            stop = min(start + PAGE, upto)
            entries = await store.entries(state.id, start, stop)
            records = await _results(store, entries)
            n_out, n_err = await asyncio.to_thread(
                write_page, state.id, start, entries, records, outcome, out, err
            )
            out.flush()
            err.flush()
            done["written_at"] = stop
            done["out_bytes"] = out_part.stat().st_size
            done["err_bytes"] = err_part.stat().st_size
            done["written_out"] += n_out
            done["written_err"] += n_err
            async with store.redis.pipeline(transaction=True) as pipe:
                pipe.hset(store.keys.batch(state.id), mapping=done)
                chunks = _forget(pipe, store, [e.job_id for e in entries if e.job_id])
                replies = await pipe.execute()
            await _drop_emptied(store, chunks, replies)
    return state.model_copy(update=done)


def _rewind(part: Path, size: int) -> None:
    """Cut ``part`` back to the ``size`` its batch recorded (what a crash wrote past it goes)."""
    actual = part.stat().st_size if part.exists() else 0
    if actual < size:
        raise BatchFilesLost(
            f"{part.name} holds {actual} bytes, the batch recorded {size}: its file store changed"
        )
    if actual > size:
        os.truncate(part, size)


async def _write_files(store: BatchStore, state: BatchState, lease: Lease, outcome: str) -> tuple[int, int]:
    """The rest of both files (entries not yet appended, then the lines never submitted);
    published only once complete."""
    state = await append(store, state, lease, state.submitted, outcome)
    if outcome != "completed" and state.written_at < state.total:
        err_part = store.files.part_path(state.err_file)
        _rewind(err_part, state.err_bytes)
        source = store.files.path(state.input_file_id)
        with open(err_part, "a", encoding="utf-8") as err:
            n = await asyncio.to_thread(
                write_unsubmitted, source, state.id, state.offset, state.submitted, outcome, err
            )
        update = {
            "written_at": state.total,
            "err_bytes": err_part.stat().st_size,
            "written_err": state.written_err + n,
        }
        await store.redis.hset(store.keys.batch(state.id), mapping=update)
        state = state.model_copy(update=update)
    for file_id, count in ((state.out_file, state.written_out), (state.err_file, state.written_err)):
        part = store.files.part_path(file_id)
        if count and part.exists():
            store.files.publish(file_id)
        elif count and not store.files.path(file_id).exists():
            raise BatchFilesLost(f"{file_id} is neither being written nor published: its file store changed")
        elif not count:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
    return state.written_out, state.written_err


async def _results(store: BatchStore, entries: Sequence[Entry]) -> list[tuple[str | None, str | None]]:
    """Per entry: its job's (status, result envelope), both None if it has no job or it is gone."""
    located = [chunk_of(e.job_id) if e.job_id else None for e in entries]
    plain = [e.job_id for e, c in zip(entries, located, strict=True) if c is None and e.job_id]
    async with store.redis.pipeline(transaction=False) as pipe:
        for job_id in plain:
            pipe.hmget(store.keys.job(job_id), "status", "result")
        fetched = iter(await pipe.execute())
    groups: dict[str, list[int]] = {}
    for chunk in located:
        if chunk is not None:
            groups.setdefault(chunk[0], []).append(chunk[1])
    read = await read_chunk_jobs(store.redis, store.keys, list(groups.items()), attempts=True)
    found: dict[tuple[str, int], tuple[str | None, str | None]] = {}
    for (chunk_id, indices), jobs in zip(groups.items(), read, strict=True):
        for j, index in enumerate(indices):
            found[(chunk_id, index)] = _chunk_job(jobs, j)
    out: list[tuple[str | None, str | None]] = []
    for entry, chunk in zip(entries, located, strict=True):
        if chunk is not None:
            out.append(found[chunk])
        elif entry.job_id:
            status, result = next(fetched)
            out.append((status, result))
        else:
            out.append((None, None))
    return out


def _chunk_job(jobs: ChunkJobs, j: int) -> tuple[str | None, str | None]:
    """(status, envelope) of the ``j``-th job asked for of a chunk."""
    if jobs.head is None:
        return None, None  # the chunk's record is gone
    result = jobs.results[j]
    if isinstance(result, BlockRow):
        return "succeeded", result.envelope().model_dump_json(exclude_none=True)
    if result is not None:
        matched = STATUS_IN_ENVELOPE.search(result, 0, 512)
        return (matched.group(1) if matched else "failed"), result
    return ("running" if jobs.attempts[j] else "queued"), None


def _forget(pipe: Any, store: BatchStore, job_ids: Sequence[str]) -> list[str]:
    """Queue the removal of written jobs: their records, or their fields in their chunks (whose
    count of removed jobs is raised: :func:`_drop_emptied` deletes a chunk once all are)."""
    plain, chunks = group_by_chunk(job_ids)
    for p in plain:
        pipe.unlink(store.keys.job(job_ids[p]), store.keys.done(job_ids[p]))
    for chunk_id, members in chunks.items():
        key = store.keys.chunk(chunk_id)
        fields = [f(i) for _, i in members for f in (result_field, metadata_field)]
        pipe.hdel(key, *fields)
        pipe.hincrby(key, WRITTEN_FIELD, len(members))
        pipe.hget(key, "n")
    return list(chunks)


async def _drop_emptied(store: BatchStore, chunk_ids: list[str], replies: list[Any]) -> None:
    """Delete the chunks all of whose jobs are written (``replies``: the transaction's, whose
    tail holds each chunk's HDEL, HINCRBY and HGET n, in order)."""
    tail = replies[len(replies) - 3 * len(chunk_ids) :] if chunk_ids else []
    emptied = [
        store.keys.chunk(chunk_id)
        for chunk_id, (_, written, n) in zip(chunk_ids, _triples(tail), strict=True)
        if n is not None and int(written) >= int(n)
    ]
    if emptied:
        await store.redis.unlink(*emptied)


def _triples(values: list[Any]) -> list[tuple[Any, Any, Any]]:
    return [(values[i], values[i + 1], values[i + 2]) for i in range(0, len(values), 3)]
