"""What a table's rows become, per kind: the request of each row, and the Parquet part of a window.

- **embed**: a text column; out ``embedding`` (``fixed_size_list<float32, d>``, read as arrays:
  no envelope per row) and ``prompt_tokens``.
- **rerank**: a query column and a documents column (a list of texts, or its JSON text in a
  CSV); out ``results`` (``list<struct<index: int32, relevance_score: float32>>``, best first,
  cut to ``top_n``) and ``total_tokens``.
- **chat**: a prompt column (the user's message, after an optional system message); out
  ``text``, ``finish_reason``, ``prompt_tokens`` and ``completion_tokens``.

Every part has ``id`` first and ``route`` and ``error`` last: a failed row has its error and
nulls (an embedding of NaN: Parquet as pyarrow writes it holds no null fixed-size list).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..client import Client, VectorBlock
from ..contract import JobResult, Status
from ..errors import OverspillError

KINDS = ("embed", "rerank", "chat")
RANKED = pa.list_(pa.struct([("index", pa.int32()), ("relevance_score", pa.float32())]))


class TableError(OverspillError):
    """A table that cannot be run (a missing column, a bad row's type, a resume of another input)."""


@dataclass
class Window:
    number: int
    columns: dict[str, list[Any]]  # the input columns this kind reads, row by row
    ids: pa.Array

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class TableKind:
    """How one kind's table runs: set from the command's options."""

    kind: str
    model: str
    text: str = "text"  # embed's text, chat's prompt
    query: str = "query"
    documents: str = "documents"
    options: dict[str, Any] = field(default_factory=dict)  # top_n; system, max_tokens, temperature

    @property
    def columns(self) -> list[str]:
        return [self.query, self.documents] if self.kind == "rerank" else [self.text]

    def identity(self) -> dict[str, Any]:
        """What a resume must find the same (an embedding run's state has only its model)."""
        if self.kind == "embed":
            return {"model": self.model}
        return {"model": self.model, "kind": self.kind, "columns": self.columns, "options": self.options}

    def check(self, column: str, value: Any, row: int) -> Any:
        """A cell as its request takes it; a TableError names the row otherwise."""
        if column == self.documents and self.kind == "rerank":
            try:
                docs = json.loads(value) if isinstance(value, str) else value
            except ValueError:
                docs = None
            if isinstance(docs, list) and docs and all(isinstance(d, str) for d in docs):
                return docs
            raise TableError(f"row {row}: {column!r} must be a non-empty list of texts")
        if not isinstance(value, str):
            raise TableError(f"row {row}: {column!r} is empty (null)")
        return value

    def bodies(self, window: Window) -> list[tuple[str, dict[str, Any]]]:
        """Each row's request, in order."""
        if self.kind == "rerank":
            top_n = {"top_n": self.options["top_n"]} if self.options.get("top_n") else {}
            rows = zip(window.columns[self.query], window.columns[self.documents], strict=True)
            return [("rerank", {"model": self.model, "query": q, "documents": d, **top_n}) for q, d in rows]
        if self.kind == "chat":
            system = self.options.get("system")
            head = [{"role": "system", "content": system}] if system else []
            params = {
                k: v for k, v in self.options.items() if k in ("max_tokens", "temperature") and v is not None
            }
            return [
                ("chat", {"model": self.model, "messages": [*head, {"role": "user", "content": p}], **params})
                for p in window.columns[self.text]
            ]
        return [("embed", {"model": self.model, "input": t}) for t in window.columns[self.text]]

    def results(
        self, client: Client, job_ids: list[str], timeout: float, tenant: str
    ) -> AsyncIterator[VectorBlock | list[JobResult]]:
        """The window's results as they finish: vectors as arrays, others as envelopes."""
        if self.kind == "embed":
            return client.iter_arrays(job_ids, timeout, tenant=tenant)
        return _envelopes(client, job_ids, timeout, tenant)

    def part(self, window: Window, job_ids: list[str], found: list[Any]) -> tuple[pa.Table, int]:
        """A window's rows in input order, and how many failed."""
        if self.kind == "embed":
            return embedding_part(window, job_ids, found)
        results = {r.id: r for batch in found for r in batch}
        ordered = [results[i] for i in job_ids]
        ok = [r.status == Status.succeeded and r.body is not None for r in ordered]
        columns = (_rerank_columns if self.kind == "rerank" else _chat_columns)(ordered, ok)
        table = pa.table(
            {
                "id": window.ids,
                **columns,
                "route": pa.array([r.route.value if r.route else None for r in ordered], pa.string()),
                "error": pa.array([_error(r) for r in ordered], pa.string()),
            }
        )
        return table, ok.count(False)


async def _envelopes(
    client: Client, job_ids: list[str], timeout: float, tenant: str
) -> AsyncIterator[list[JobResult]]:
    batch: list[JobResult] = []
    async for result in client.iter_results(job_ids, timeout, tenant=tenant):
        batch.append(result)
        if len(batch) >= 256:
            yield batch
            batch = []
    if batch:
        yield batch


def _error(result: JobResult) -> str | None:
    if result.status == Status.succeeded:
        return None
    error = result.error
    return f"{error.type}: {error.message}" if error else str(result.status)


def _picker(
    results: list[JobResult], ok: list[bool]
) -> Callable[[Callable[[dict[str, Any]], Any]], list[Any]]:
    """A column read from each succeeded row's body (null for a failed row)."""

    def pick(read: Callable[[dict[str, Any]], Any]) -> list[Any]:
        return [read(r.body) if good and r.body else None for r, good in zip(results, ok, strict=True)]

    return pick


def _ranked(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"index": x["index"], "relevance_score": x["relevance_score"]} for x in body["results"]]


def _rerank_columns(results: list[JobResult], ok: list[bool]) -> dict[str, pa.Array]:
    pick = _picker(results, ok)
    return {
        "results": pa.array(pick(_ranked), RANKED),
        "total_tokens": pa.array(pick(lambda b: b["usage"]["total_tokens"]), pa.int64()),
    }


def _chat_columns(results: list[JobResult], ok: list[bool]) -> dict[str, pa.Array]:
    pick = _picker(results, ok)
    return {
        "text": pa.array(pick(lambda b: b["choices"][0]["message"]["content"]), pa.string()),
        "finish_reason": pa.array(pick(lambda b: b["choices"][0]["finish_reason"]), pa.string()),
        "prompt_tokens": pa.array(pick(lambda b: b["usage"]["prompt_tokens"]), pa.int64()),
        "completion_tokens": pa.array(pick(lambda b: b["usage"]["completion_tokens"]), pa.int64()),
    }


def embedding_part(window: Window, job_ids: list[str], blocks: list[VectorBlock]) -> tuple[pa.Table, int]:
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
            errors[position[other.id]] = _error(other)
    matrix[~valid] = np.nan
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1), pa.float32()), dims)
    table = pa.table(
        {
            "id": window.ids,
            "embedding": embedding,
            "prompt_tokens": pa.array(tokens, mask=~valid),
            "route": pa.array(routes, pa.string()),
            "error": pa.array(errors, pa.string()),
        }
    )
    return table, int(n - valid.sum())
