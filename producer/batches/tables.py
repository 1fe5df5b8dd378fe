"""``overspill bulk`` on tables: Parquet, CSV or JSONL of texts in, Parquet of vectors out.

A nightly run of millions of texts is a table, not a file of OpenAI requests. This reads a text
column (and an optional id column) in windows of rows, submits each window as bulk chunks
straight to Redis, takes its vectors back as arrays (:meth:`Client.iter_arrays`, no envelope
per row) and writes it as one Parquet part: ``id``, ``embedding`` (``fixed_size_list<float32,
d>``), ``prompt_tokens``, ``route``, ``error``. Memory stays bounded: a window is read only once
fewer than ``ahead`` windows are in flight, and a finished one is written and dropped.

Resume: the parts live in ``OUTPUT.parts/`` beside ``state.json`` (the input, window size,
model); a window's job ids are kept (``part-N.ids``) just before its jobs are written. Running
the same command again skips written parts, waits for submitted windows' jobs (their results
are in Redis; nothing runs twice), submits windows whose kept ids name no job, and the rest.
When every part is written they are joined into OUTPUT in order and the parts directory goes.
A window's chunks are deleted from Redis once its part is written, so Redis holds the windows in
flight, not the night's vectors.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from tqdm import tqdm

from ..client import Client, VectorBlock
from ..contract import chunk_of
from ..errors import JobNotFound, OverspillError

TABLE_SUFFIXES = (".parquet", ".csv")
WINDOW_ROWS = 4096  # rows per part: 16 chunks of 256
AHEAD = 4  # windows in flight at once: what bounds the client's memory


class TableError(OverspillError):
    """A table that cannot be run (a missing column, a resume of another input)."""


@dataclass
class Window:
    number: int
    texts: list[str]
    ids: pa.Array


def is_table(path: Path) -> bool:
    """Is ``path`` a table of texts (Parquet, CSV), rather than OpenAI batch lines?"""
    if path.suffix.lower() in TABLE_SUFFIXES:
        return True
    if path.suffix.lower() not in (".jsonl", ".json"):
        return False
    with path.open("rb") as f:
        first = f.readline().strip()
    try:
        line = json.loads(first) if first else None
    except ValueError:
        return False
    return isinstance(line, str) or (isinstance(line, dict) and "custom_id" not in line)


def _batches(path: Path, text: str, id_column: str | None, rows: int) -> Iterator[pa.RecordBatch]:
    columns = [text] + ([id_column] if id_column else [])
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        parquet = pq.ParquetFile(path)
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise TableError(f"{path}: no column {missing[0]!r} (it has {parquet.schema_arrow.names})")
        yield from parquet.iter_batches(batch_size=rows, columns=columns)
    elif suffix == ".csv":
        convert = pacsv.ConvertOptions(include_columns=columns, column_types={text: pa.string()})
        try:
            yield from pacsv.open_csv(path, convert_options=convert)
        except KeyError as exc:
            raise TableError(f"{path}: no column {exc}") from None
    else:
        yield from _jsonl_batches(path, text, id_column, rows)


def _jsonl_batches(path: Path, text: str, id_column: str | None, rows: int) -> Iterator[pa.RecordBatch]:
    """JSONL of plain texts: each line a JSON string, or an object with the text column."""
    texts: list[str] = []
    ids: list[Any] = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            line = json.loads(raw)
            if isinstance(line, str):
                texts.append(line)
                ids.append(None)
            elif isinstance(line, dict) and isinstance(line.get(text), str):
                texts.append(line[text])
                ids.append(line.get(id_column) if id_column else None)
            else:
                raise TableError(f"{path}:{number}: a JSON string or an object with a {text!r} text")
            if len(texts) == rows:
                yield _record_batch(texts, ids, text, id_column)
                texts, ids = [], []
    if texts:
        yield _record_batch(texts, ids, text, id_column)


def _record_batch(texts: list[str], ids: list[Any], text: str, id_column: str | None) -> pa.RecordBatch:
    arrays = {text: pa.array(texts, pa.string())}
    if id_column:
        arrays[id_column] = pa.array(ids)
    return pa.RecordBatch.from_pydict(arrays)


def windows(path: Path, text: str, id_column: str | None, rows: int = WINDOW_ROWS) -> Iterator[Window]:
    """The input in windows of ``rows`` rows (the last may be shorter), numbered from 0; rows
    without an id column are identified by their row number."""
    pending: list[pa.RecordBatch] = []
    held = start = number = 0
    for batch in _batches(path, text, id_column, rows):
        pending.append(batch)
        held += batch.num_rows
        while held >= rows:
            table = pa.Table.from_batches(pending)
            yield _window(table.slice(0, rows), number, start, text, id_column)
            rest = table.slice(rows)
            pending, held = rest.to_batches(), rest.num_rows
            start, number = start + rows, number + 1
    if held:
        yield _window(pa.Table.from_batches(pending), number, start, text, id_column)


def _window(table: pa.Table, number: int, start: int, text: str, id_column: str | None) -> Window:
    texts = table.column(text).to_pylist()
    blank = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if blank is not None:
        raise TableError(f"row {start + blank}: {text!r} is empty (null)")
    ids = (
        table.column(id_column).combine_chunks()
        if id_column
        else pa.array(np.arange(start, start + len(texts), dtype=np.int64))
    )
    return Window(number, texts, ids)


class Parts:
    """``OUTPUT.parts/``: the state of a run, a part file per written window."""

    def __init__(self, output: Path, identity: dict[str, Any]) -> None:
        self.dir = output.with_name(output.name + ".parts")
        self.output = output
        self.dir.mkdir(exist_ok=True)
        state = self.dir / "state.json"
        if state.exists():
            kept = json.loads(state.read_text())
            if kept != identity:
                raise TableError(f"{self.dir} holds another run ({kept}); remove it to start over")
        else:
            _write_atomic(state, json.dumps(identity).encode())

    def part(self, number: int) -> Path:
        return self.dir / f"part-{number:06d}.parquet"

    def _ids(self, number: int) -> Path:
        return self.dir / f"part-{number:06d}.ids"

    def ids(self, number: int) -> list[str] | None:
        path = self._ids(number)
        return json.loads(path.read_text()) if path.exists() else None

    def keep_ids(self, number: int, job_ids: list[str]) -> None:
        _write_atomic(self._ids(number), json.dumps(job_ids).encode())

    def write(self, number: int, table: pa.Table) -> None:
        tmp = self.part(number).with_suffix(".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, self.part(number))

    def forget_ids(self, number: int) -> None:
        """A written part's ids are no longer needed: its chunks are gone from Redis."""
        self._ids(number).unlink(missing_ok=True)

    def join(self, count: int) -> int:
        """Every part into OUTPUT, in order, one row group each; the rows written."""
        rows = 0
        tmp = self.output.with_name(self.output.name + ".tmp")
        writer: pq.ParquetWriter | None = None
        for number in range(count):
            table = pq.read_table(self.part(number))
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
            rows += table.num_rows
            del table
            pa.default_memory_pool().release_unused()  # one part's buffers at a time, not all of them
        if writer is not None:
            writer.close()
            os.replace(tmp, self.output)
        for path in self.dir.iterdir():
            path.unlink()
        self.dir.rmdir()
        return rows


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def part_table(window: Window, job_ids: list[str], blocks: list[VectorBlock]) -> pa.Table:
    """A window's rows, in input order: its vectors, tokens, routes, or each failed row's error."""
    position = {job_id: row for row, job_id in enumerate(job_ids)}
    n = len(job_ids)
    dims = next((b.vectors.shape[1] for b in blocks if len(b) and b.vectors.size), 0)
    matrix = np.zeros((n, dims), dtype=np.float32)
    valid = np.zeros(n, dtype=bool)
    tokens = np.zeros(n, dtype=np.int64)
    routes: list[str | None] = [None] * n
    errors: list[str | None] = [None] * n
    for block in blocks:
        rows = np.fromiter((position[i] for i in block.ids), dtype=np.int64, count=len(block.ids))
        if len(rows):
            # one input per row: each job's first vector (its offsets step by one)
            matrix[rows] = block.vectors[block.offsets[:-1]]
            valid[rows] = True
            tokens[rows] = block.tokens
            for row, route in zip(rows.tolist(), block.routes, strict=True):
                routes[row] = route
        for other in block.others:
            row = position[other.id]
            error = other.error
            errors[row] = f"{error.type}: {error.message}" if error else str(other.status)
    # A failed row's vector is all NaN, never a number a search could match: Parquet as pyarrow
    # writes it holds no null fixed-size list ("non-zero length null components").
    matrix[~valid] = np.nan
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1), pa.float32()), dims)
    return pa.table(
        {
            "id": window.ids,
            "embedding": embedding,
            "prompt_tokens": pa.array(tokens, mask=~valid),
            "route": pa.array(routes, pa.string()),
            "error": pa.array(errors, pa.string()),
        }
    )


@dataclass
class TableRun:
    """One ``overspill bulk`` of a table; :meth:`run` returns its summary."""

    client: Client
    input_path: Path
    output: Path
    model: str
    text_column: str = "text"
    id_column: str | None = None
    tenant: str = "default"
    window_rows: int = WINDOW_ROWS
    ahead: int = AHEAD
    timeout_s: float = 24 * 3600

    async def run(self) -> dict[str, Any]:
        identity = {"input": str(self.input_path.resolve()), "rows": self.window_rows, "model": self.model}
        parts = Parts(self.output, identity)
        bar = tqdm(unit="row", file=sys.stderr, mininterval=0.5, desc="bulk")
        failed = windows_seen = 0
        slots = asyncio.Semaphore(self.ahead)
        tasks: list[asyncio.Task[int]] = []
        try:
            for window in windows(self.input_path, self.text_column, self.id_column, self.window_rows):
                windows_seen = window.number + 1
                if parts.part(window.number).exists():
                    bar.update(len(window.texts))
                    written = parts.ids(window.number)
                    if written:  # killed between writing the part and deleting its chunks
                        await self._forget(window.number, written, parts)
                    continue
                await slots.acquire()
                job_ids = parts.ids(window.number) or await self._submit(window, parts)
                task = asyncio.create_task(self._finish(window, job_ids, parts, bar))
                task.add_done_callback(lambda _: slots.release())
                tasks.append(task)
                failed += sum(t.result() for t in tasks if t.done())
                tasks = [t for t in tasks if not t.done()]
            failed += sum(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            bar.close()
        rows = parts.join(windows_seen)
        return {"output": str(self.output), "rows": rows, "failed": failed, "parts": windows_seen}

    async def _submit(self, window: Window, parts: Parts) -> list[str]:
        requests = [("embed", {"model": self.model, "input": text}) for text in window.texts]
        kept: list[str] = []

        def keep(_pipe: Any, job_ids: list[str]) -> None:
            # Written ahead: the ids are on disk before the jobs exist. A kill in between leaves
            # ids of no job, which a resume finds missing and submits again; never jobs that no
            # file names, which it would run twice.
            parts.keep_ids(window.number, job_ids)
            kept.extend(job_ids)

        # Checked by the worker, row by row: one bad text fails alone, not its window.
        await self.client.submit_many(requests, lane="bulk", tenant=self.tenant, validate=False, also=keep)
        return kept

    async def _finish(self, window: Window, job_ids: list[str], parts: Parts, bar: Any) -> int:
        """Wait for a window's jobs, write its part; the rows that failed."""
        try:
            blocks = await self._blocks(job_ids, bar)
        except JobNotFound:  # kept ids of jobs never written (or long expired): submit them now
            job_ids = await self._submit(window, parts)
            blocks = await self._blocks(job_ids, bar)
        parts.write(window.number, part_table(window, job_ids, blocks))
        await self._forget(window.number, job_ids, parts)
        return sum(len(b.others) for b in blocks)

    async def _forget(self, number: int, job_ids: list[str], parts: Parts) -> None:
        """Delete a written window's chunks: its rows are on disk, and a resume skips its part. So
        Redis holds only the windows in flight, not a night's vectors until they expire. Its ids
        go last: a resume that finds them beside the part deletes the chunks a kill left."""
        chunks = {located[0] for located in map(chunk_of, job_ids) if located is not None}
        if chunks:
            await self.client.redis.unlink(*(self.client.keys.chunk(c) for c in chunks))
        parts.forget_ids(number)

    async def _blocks(self, job_ids: list[str], bar: Any) -> list[VectorBlock]:
        blocks: list[VectorBlock] = []
        async for block in self.client.iter_arrays(job_ids, self.timeout_s, tenant=self.tenant):
            blocks.append(block)
            bar.update(len(block) + len(block.others))
        return blocks
