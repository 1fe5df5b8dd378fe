"""``overspill bulk`` on tables: Parquet, CSV or JSONL in, Parquet out.

A nightly run of millions of texts is a table, not a file of OpenAI requests. This reads a
kind's columns (``table_kinds.py``: a text to embed, a query and its documents to rerank, a
prompt to chat on) and an optional id column in windows of rows, submits each window as bulk
chunks straight to Redis, takes its results back (vectors as arrays, :meth:`Client.iter_arrays`,
no envelope per row) and writes it as one Parquet part: ``id``, the kind's columns (for
embeddings ``embedding``, ``fixed_size_list<float32, d>``, and ``prompt_tokens``), ``route``,
``error``. Memory stays bounded: a window is read only once
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

from ..client import Client
from ..contract import chunk_of
from ..errors import JobNotFound
from .table_kinds import TableError, TableKind, Window

TABLE_SUFFIXES = (".parquet", ".csv")
WINDOW_ROWS = 4096  # rows per part: 16 chunks of 256
AHEAD = 4  # windows in flight at once: what bounds the client's memory


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


def _batches(path: Path, kind: TableKind, id_column: str | None, rows: int) -> Iterator[pa.RecordBatch]:
    columns = kind.columns + ([id_column] if id_column else [])
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        parquet = pq.ParquetFile(path)
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise TableError(f"{path}: no column {missing[0]!r} (it has {parquet.schema_arrow.names})")
        yield from parquet.iter_batches(batch_size=rows, columns=columns)
    elif suffix == ".csv":
        types = {c: pa.string() for c in kind.columns}
        convert = pacsv.ConvertOptions(include_columns=columns, column_types=types)
        try:
            yield from pacsv.open_csv(path, convert_options=convert)
        except KeyError as exc:
            raise TableError(f"{path}: no column {exc}") from None
    else:
        yield from _jsonl_batches(path, kind.columns, id_column, rows)


def _jsonl_batches(
    path: Path, columns: list[str], id_column: str | None, rows: int
) -> Iterator[pa.RecordBatch]:
    """JSONL: each line an object with the columns, or (one text column) a JSON string."""
    values: dict[str, list[Any]] = {c: [] for c in columns}
    ids: list[Any] = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            line = json.loads(raw)
            if isinstance(line, str) and len(columns) == 1:
                line = {columns[0]: line}
            if not isinstance(line, dict) or any(c not in line for c in columns):
                raise TableError(f"{path}:{number}: a JSON object with {', '.join(map(repr, columns))}")
            for c in columns:
                values[c].append(line[c])
            ids.append(line.get(id_column) if id_column else None)
            if len(ids) == rows:
                yield _record_batch(values, ids, id_column)
                values, ids = {c: [] for c in columns}, []
    if ids:
        yield _record_batch(values, ids, id_column)


def _record_batch(values: dict[str, list[Any]], ids: list[Any], id_column: str | None) -> pa.RecordBatch:
    arrays = {c: pa.array(v) for c, v in values.items()}
    if id_column:
        arrays[id_column] = pa.array(ids)
    return pa.RecordBatch.from_pydict(arrays)


def windows(path: Path, kind: TableKind, id_column: str | None, rows: int = WINDOW_ROWS) -> Iterator[Window]:
    """The input in windows of ``rows`` rows (the last may be shorter), numbered from 0; rows
    without an id column are identified by their row number."""
    pending: list[pa.RecordBatch] = []
    held = start = number = 0
    for batch in _batches(path, kind, id_column, rows):
        pending.append(batch)
        held += batch.num_rows
        while held >= rows:
            table = pa.Table.from_batches(pending)
            yield _window(table.slice(0, rows), number, start, kind, id_column)
            rest = table.slice(rows)
            pending, held = rest.to_batches(), rest.num_rows
            start, number = start + rows, number + 1
    if held:
        yield _window(pa.Table.from_batches(pending), number, start, kind, id_column)


def _window(table: pa.Table, number: int, start: int, kind: TableKind, id_column: str | None) -> Window:
    columns = {
        c: [kind.check(c, v, start + i) for i, v in enumerate(table.column(c).to_pylist())]
        for c in kind.columns
    }
    ids = (
        table.column(id_column).combine_chunks()
        if id_column
        else pa.array(np.arange(start, start + table.num_rows, dtype=np.int64))
    )
    return Window(number, columns, ids)


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
    kind: TableKind | None = None  # what its rows are (default: texts to embed with ``model``)

    def __post_init__(self) -> None:
        if self.kind is None:
            self.kind = TableKind("embed", self.model, text=self.text_column)

    @property
    def table(self) -> TableKind:
        assert self.kind is not None  # set in __post_init__
        return self.kind

    async def run(self) -> dict[str, Any]:
        identity = {
            "input": str(self.input_path.resolve()),
            "rows": self.window_rows,
            **self.table.identity(),
        }
        parts = Parts(self.output, identity)
        bar = tqdm(unit="row", file=sys.stderr, mininterval=0.5, desc="bulk")
        failed = windows_seen = 0
        slots = asyncio.Semaphore(self.ahead)
        tasks: list[asyncio.Task[int]] = []
        try:
            for window in windows(self.input_path, self.table, self.id_column, self.window_rows):
                windows_seen = window.number + 1
                if parts.part(window.number).exists():
                    bar.update(len(window))
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
        requests = self.table.bodies(window)
        kept: list[str] = []

        def keep(_pipe: Any, job_ids: list[str]) -> None:
            # Written ahead: the ids are on disk before the jobs exist. A kill in between leaves
            # ids of no job, which a resume finds missing and submits again; never jobs that no
            # file names, which it would run twice.
            parts.keep_ids(window.number, job_ids)
            kept.extend(job_ids)

        # Checked by the worker, row by row: one bad row fails alone, not its window.
        await self.client.submit_many(requests, lane="bulk", tenant=self.tenant, validate=False, also=keep)
        return kept

    async def _finish(self, window: Window, job_ids: list[str], parts: Parts, bar: Any) -> int:
        """Wait for a window's jobs, write its part; the rows that failed."""
        try:
            found = await self._results(job_ids, bar)
        except JobNotFound:  # kept ids of jobs never written (or long expired): submit them now
            job_ids = await self._submit(window, parts)
            found = await self._results(job_ids, bar)
        table, failed = self.table.part(window, job_ids, found)
        parts.write(window.number, table)
        await self._forget(window.number, job_ids, parts)
        return failed

    async def _forget(self, number: int, job_ids: list[str], parts: Parts) -> None:
        """Delete a written window's chunks: its rows are on disk, and a resume skips its part. So
        Redis holds only the windows in flight, not a night's vectors until they expire. Its ids
        go last: a resume that finds them beside the part deletes the chunks a kill left."""
        chunks = {located[0] for located in map(chunk_of, job_ids) if located is not None}
        if chunks:
            await self.client.redis.unlink(*(self.client.keys.chunk(c) for c in chunks))
        parts.forget_ids(number)

    async def _results(self, job_ids: list[str], bar: Any) -> list[Any]:
        found: list[Any] = []
        async for got in self.table.results(self.client, job_ids, self.timeout_s, self.tenant):
            found.append(got)
            bar.update(len(got) + len(getattr(got, "others", ())))
        return found
