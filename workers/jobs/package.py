"""A work package as it comes off the queue: its items decoded, the malformed ones kept raw.

A package is a map with ``items`` (interactive jobs) or a bulk ``chunk`` (many jobs under one
record); an item that does not parse fails alone, never its package.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import TypeAdapter, ValidationError

from producer.contract import (
    ErrorInfo,
    ErrorType,
    JobKind,
    JobResult,
    Status,
    Timings,
    WorkItem,
    expand_chunk,
    get_logger,
    trusted,
)

from .store import JobStore

log = get_logger("workers.jobs.package")

KINDS = frozenset(k.value for k in JobKind)  # what a raw item's "kind" may name


class Unavailable:
    """Marker: this job could not reach a backend; try it again later."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


_ITEMS = TypeAdapter(list[WorkItem])


def timed(batch_ms: float, infer_ms: float, batch_size: int) -> Timings:
    """A result's timings (queued and total are set when the result is made)."""
    values = {
        "queued_ms": 0.0,
        "batch_ms": batch_ms,
        "infer_ms": infer_ms,
        "batch_size": batch_size,
        "total_ms": 0.0,
    }
    return trusted(Timings, values)


def package_payload(payload: Any) -> dict[str, Any]:
    """The package as a map; a bare list is taken as its items, anything else has none."""
    if isinstance(payload, dict):
        if "chunk" in payload:  # a bulk chunk: its jobs as ordinary items
            return {**payload, "items": expand_chunk(payload)}
        return payload
    log.error("work package payload is not a map", payload_type=type(payload).__name__)
    return {"items": payload} if isinstance(payload, list) else {}


def package_order(payload: dict[str, Any]) -> int | None:
    """The package's place in its tenant's line (``contract/fairness.py``), kept by re-queues."""
    order = payload.get("order")
    return order if type(order) is int else None


def raw_items(payload: Any) -> list[dict[str, Any]]:
    """The package's items as they came, whatever they are (to fail the jobs they name)."""
    raws = package_payload(payload).get("items")
    return [r for r in raws if isinstance(r, dict)] if isinstance(raws, list) else []


def decode_items(payload: dict[str, Any]) -> tuple[list[WorkItem], list[dict[str, Any]]]:
    """Parse a package's items; those that do not parse come back raw, to fail alone."""
    raws = payload.get("items", [])
    if not isinstance(raws, list):
        log.error("work package items are not a list", items_type=type(raws).__name__)
        return [], []
    try:  # one validation call for the whole package; item by item only if something is bad
        return _ITEMS.validate_python(raws), []
    except ValidationError:
        pass
    items: list[WorkItem] = []
    malformed: list[dict[str, Any]] = []
    for raw in raws:
        try:
            items.append(WorkItem.model_validate(raw))
        except ValidationError as exc:
            job_id = raw.get("id") if isinstance(raw, dict) else None
            log.error("malformed work item", job_id=job_id, error=str(exc)[:200])
            if isinstance(raw, dict):
                malformed.append(raw)
    return items, malformed


async def fail_raw(store: JobStore, raws: list[dict[str, Any]], error_type: ErrorType, message: str) -> int:
    """Fail the jobs of raw items (anything with a string ``id``) that are not terminal yet.

    The kind comes from the item if it names one, else from the job record: an item whose
    own kind is garbage still ends its job. Returns how many jobs this failed.
    """
    named = [r for r in raws if isinstance(r.get("id"), str)]
    if not named:
        return 0
    kinds = await store.record_kinds([r["id"] for r in named])
    now = time.time()
    results = []
    error = ErrorInfo(type=error_type, message=message)
    for raw, recorded in zip(named, kinds, strict=True):
        kind = next((k for k in (raw.get("kind"), recorded) if k in KINDS), None)
        if kind is None:
            log.error("item names no job of any kind; nothing to fail", job_id=raw["id"])
            continue
        results.append(
            JobResult(
                id=raw["id"], kind=kind, status=Status.failed, created_at=now, finished_at=now, error=error
            )
        )
    return sum(await store.finish(results))
