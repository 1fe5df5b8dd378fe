"""A job's result envelope as the item path makes it: from validated values, not validated again."""

from __future__ import annotations

import time
from typing import Any

from producer.contract import (
    ErrorInfo,
    ErrorType,
    JobResult,
    Route,
    RouteReason,
    Status,
    Timings,
    WorkItem,
    packed,
    trusted,
)

from .package import timed


def result_of(
    item: WorkItem,
    picked: float,
    status: Status,
    *,
    body: dict[str, Any] | None = None,
    error: ErrorInfo | None = None,
    model: str | None = None,
    route: Route | None = None,
    reason: RouteReason | None = None,
    timings: Timings | None = None,
) -> JobResult:
    finished = time.time()
    t = timings or timed(0.0, 0.0, 0)
    t.queued_ms = round((picked - item.created_at) * 1000, 3)
    t.total_ms = round((finished - item.created_at) * 1000, 3)
    # Every field comes from validated values: construct, do not validate again.
    return trusted(
        JobResult,
        {
            "id": item.id,
            "kind": item.kind,
            "status": status,
            "tenant": item.tenant,
            "route": route,
            "route_reason": reason,
            "model": model,
            "body": body,
            "error": error,
            "timings": t,
            "attempts": item.attempt,
            "created_at": item.created_at,
            "finished_at": finished,
            "metadata": item.metadata,
            "packed_vectors": packed(item.kind, item.body, body),
        },
    )


def expired(item: WorkItem, picked: float, retries: int) -> JobResult:
    why = "while waiting for an available backend" if retries else "before a worker picked it up"
    error = ErrorInfo(type=ErrorType.deadline_exceeded, message=f"the job's deadline passed {why}")
    return result_of(item, picked, Status.expired, error=error)


def crashed(item: WorkItem, crashes: int, picked: float) -> JobResult:
    message = f"the job's work package crashed or timed out {crashes} times; giving up"
    error = ErrorInfo(type=ErrorType.worker_crashed, message=message)
    return result_of(item, picked, Status.failed, error=error)
