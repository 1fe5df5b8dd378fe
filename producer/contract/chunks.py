"""Bulk chunks: many jobs of one bulk submission under one Redis record and one work package.

A nightly run never polls lines one by one, and a record, a done list and their expiries per
job cost more Redis and client CPU than the model's work on a fast GPU. So a bulk
``submit_many`` puts up to ``chunk_size`` jobs that share kind, model and options into one
*chunk*. Each job keeps its own id (``<chunk id>.<index>``), attempts and result, as fields of
the chunk's hash:

- shared: ``kind``, ``tenant``, ``lane``, ``created_at``, ``metadata`` (JSON), ``n`` (jobs), ``d``
  (how many are terminal: a reader asks for results only when it moved), ``w`` (how many a
  batch has written to its output file and removed from the chunk; at ``n`` the chunk goes),
  ``mo`` (set when some job has metadata of its own);
- per job, in one field for all of them: ``x`` where its result is and ``y`` its attempts
  (``blocks.py``); ``b<k>`` result blocks;
- per job ``i``, where it has one: ``r<i>`` its terminal envelope (a job finished on its own, not
  in a block), ``m<i>`` its own metadata (JSON).

The chunk's work package carries the shared fields once and ``[index, body]`` per job; a
worker expands it into ordinary work items (:func:`expand_chunk`), so routing, batching,
isolation of a bad item and crash splitting are the same as for any package. A split or a
re-queue queues a chunk package with the remaining indices (:func:`chunk_payload`).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import Any

from .options import WorkItem

CHUNK_PREFIX = "chk_"
# A client's defaults: jobs per work package, and jobs per bulk chunk. Workers take them as the
# size of a lane's packages until they have seen one (admission's first estimate). Packages of 64
# were tried against the stack overspill up starts (python -m bench.outside --rate 2900, with and
# without --pack-size 64): throughput and latency at that rate moved within run-to-run noise, so
# the interactive lane keeps 32.
DEFAULT_PACK_SIZE = 32
DEFAULT_CHUNK_SIZE = 256
CHUNK_ID = re.compile(r"chk_[0-9a-f]{24}")
_ITEM_ID = re.compile(r"(chk_[0-9a-f]{24})\.(0|[1-9][0-9]{0,5})")
# Header fields a chunk package carries once for all its jobs (a WorkItem's, but id and body).
HEADER_FIELDS = ("kind", "tenant", "lane", "created_at", "deadline_at", "route", "local_only", "metadata")


def new_chunk_id() -> str:
    return CHUNK_PREFIX + secrets.token_hex(12)


def chunk_item_id(chunk_id: str, index: int) -> str:
    return f"{chunk_id}.{index}"


def chunk_of(job_id: str) -> tuple[str, int] | None:
    """``(chunk id, index)`` for the id of a job in a chunk, else None."""
    if not job_id.startswith(CHUNK_PREFIX):
        return None
    match = _ITEM_ID.fullmatch(job_id)
    return (match.group(1), int(match.group(2))) if match else None


def group_by_chunk(job_ids: Sequence[str]) -> tuple[list[int], dict[str, list[tuple[int, int]]]]:
    """Positions of the jobs among ``job_ids`` with records of their own, and per chunk its
    jobs' (position, index)."""
    plain: list[int] = []
    chunks: dict[str, list[tuple[int, int]]] = {}
    for position, job_id in enumerate(job_ids):
        located = chunk_of(job_id)
        if located is None:
            plain.append(position)
        else:
            chunks.setdefault(located[0], []).append((position, located[1]))
    return plain, chunks


def result_field(index: int | str) -> str:
    return f"r{index}"


def metadata_field(index: int | str) -> str:
    return f"m{index}"


def chunk_payload(items: list[WorkItem]) -> dict[str, Any]:
    """The package payload of jobs of one chunk (all from the same submission)."""
    first = items[0]
    located = chunk_of(first.id)
    if located is None:
        raise ValueError(f"{first.id} is not a job of a chunk")
    header: dict[str, Any] = first.model_dump(mode="json", include=set(HEADER_FIELDS))
    header["id"] = located[0]
    entries: list[list[Any]] = []
    for item in items:
        where = chunk_of(item.id)
        if where is None or where[0] != located[0]:
            raise ValueError(f"{item.id} is not a job of chunk {located[0]}")
        entry: list[Any] = [where[1], item.body]
        if item.metadata != first.metadata:
            entry.append(item.metadata)
        entries.append(entry)
    return {"chunk": header, "entries": entries}


def expand_chunk(payload: dict[str, Any]) -> list[Any]:
    """A chunk package's jobs as plain work-item maps (what an ordinary package carries).

    An entry that is not ``[index, body]`` or ``[index, body, metadata]`` comes back as it
    is, so the package's decoding fails it alone; a header without a chunk id gives no jobs.
    """
    header = payload.get("chunk")
    entries = payload.get("entries")
    if not isinstance(header, dict) or not isinstance(entries, list):
        return []
    chunk_id = header.get("id")
    if not isinstance(chunk_id, str) or CHUNK_ID.fullmatch(chunk_id) is None:
        return []
    base = {k: header[k] for k in HEADER_FIELDS if k in header}
    items: list[Any] = []
    for entry in entries:
        if isinstance(entry, list) and 2 <= len(entry) <= 3 and type(entry[0]) is int and entry[0] >= 0:
            item = {**base, "id": chunk_item_id(chunk_id, entry[0]), "body": entry[1]}
            if len(entry) == 3:
                item["metadata"] = entry[2]
            items.append(item)
        else:
            items.append(entry)
    return items
