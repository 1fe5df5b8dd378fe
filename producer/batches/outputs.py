"""Finishing a batch: its output and error files written from scratch, then the final status.

Both files are written one page of entries at a time into ``.part`` files and renamed only
once complete, then the status switches in one transition; a crash while finishing redoes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from .files import FileRecord
from .lease import Lease
from .lines import Entry, write_page, write_unsubmitted
from .state import PAGE, BatchState, BatchStatus

if TYPE_CHECKING:
    from .engine import BatchEngine

log = structlog.get_logger("producer.batches")


async def finish(
    engine: BatchEngine, state: BatchState, lease: Lease, outcome: str, current: BatchStatus
) -> BatchState | None:
    """Write the output and error files from scratch, then switch to the final status."""
    started = time.perf_counter()
    n_out, n_err = await _write_files(engine, state, lease, outcome)
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
    async with engine.redis.pipeline(transaction=True) as pipe:
        for file_id, count, kind in ((state.out_file, n_out, "output"), (state.err_file, n_err, "error")):
            if count:
                fields += [f"{kind}_file_id", file_id]
                engine.files.register(pipe, _output_record(engine, state, file_id, kind))
        await pipe.execute()
    if await engine.transition(keys=[engine.keys.batch(state.id)], args=[current.value, *fields]):
        await engine.redis.delete(engine.keys.batch_lines(state.id))
        log.info(
            "batch finished",
            batch_id=state.id,
            status=final.value,
            output=n_out,
            errors=n_err,
            write_ms=round((time.perf_counter() - started) * 1000),
        )
    return await engine.load(state.id)


def _output_record(engine: BatchEngine, state: BatchState, file_id: str, kind: str) -> FileRecord:
    return FileRecord(
        id=file_id,
        tenant=state.tenant,
        bytes=engine.files.path(file_id).stat().st_size,
        created_at=int(time.time()),
        filename=f"{state.id}_{kind}.jsonl",
        purpose="batch_output",
    )


async def _write_files(engine: BatchEngine, state: BatchState, lease: Lease, outcome: str) -> tuple[int, int]:
    """Both files, one page of entries at a time; published only once complete."""
    counts = [0, 0]
    out_part, err_part = engine.files.part_path(state.out_file), engine.files.part_path(state.err_file)
    with open(out_part, "w", encoding="utf-8") as out, open(err_part, "w", encoding="utf-8") as err:
        for start in range(0, state.submitted, PAGE):
            await lease.renew()
            entries = await engine.entries(state.id, start, min(start + PAGE, state.submitted))
            records = await _results(engine, entries)
            page = await asyncio.to_thread(write_page, state.id, start, entries, records, outcome, out, err)
            counts[0] += page[0]
            counts[1] += page[1]
        if outcome != "completed" and state.submitted < state.total:
            source = engine.files.path(state.input_file_id)
            counts[1] += await asyncio.to_thread(
                write_unsubmitted, source, state.id, state.offset, state.submitted, outcome, err
            )
    for file_id, count in ((state.out_file, counts[0]), (state.err_file, counts[1])):
        if count:
            engine.files.publish(file_id)
        else:
            with contextlib.suppress(FileNotFoundError):
                engine.files.part_path(file_id).unlink()
    return counts[0], counts[1]


async def _results(engine: BatchEngine, entries: Sequence[Entry]) -> list[tuple[str | None, str | None]]:
    async with engine.redis.pipeline(transaction=False) as pipe:
        for entry in entries:
            if entry.job_id:
                pipe.hmget(engine.keys.job(entry.job_id), "status", "result")
        fetched = iter(await pipe.execute())
    return [tuple(next(fetched)) if e.job_id else (None, None) for e in entries]  # type: ignore[misc]
