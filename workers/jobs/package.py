"""A work package as it comes off the queue: its items decoded, the malformed ones kept raw.

A package is a map with ``items`` (interactive jobs) or a bulk ``chunk`` (many jobs under one
record); an item that does not parse fails alone, never its package.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from producer.contract import JobKind, Timings, WorkItem, expand_chunk, get_logger, trusted

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
