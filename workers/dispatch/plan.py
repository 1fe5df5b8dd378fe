"""A package's jobs as planned: what each became, and how groups are cut for their backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from producer.contract import ChatRequest, EmbeddingRequest, RerankRequest, Route, RouteReason, WorkItem

from ..backends.base import Answer
from ..core.errors import WorkerError
from ..core.settings import ModelSpec


@dataclass(slots=True)
class Dispatched:
    answer: Answer
    route: Route
    reason: RouteReason


def batch_items(request: Any) -> int:
    """How many batcher items a request becomes (the unit of local load)."""
    if isinstance(request, EmbeddingRequest):
        return len(request.texts())
    if isinstance(request, RerankRequest):
        return len(request.documents)
    return 1 if isinstance(request, ChatRequest) else 0


Plan = tuple[int, WorkItem, Any, ModelSpec, str]  # index, job, its request, its model, route reason


def chunked(group: list[Plan], limit: int) -> list[list[Plan]]:
    """Consecutive chunks of ``group`` of at most ``limit`` backend inputs each (a job whose
    inputs alone pass the limit is a chunk of its own)."""
    chunks: list[list[Plan]] = []
    size = 0
    for entry in group:
        n = batch_items(entry[2])
        if not chunks or size + n > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += n
    return chunks


def failed_at(exc: Exception, route: Route) -> Exception:
    """Note where a job failed (the first backend to fail it), for its result's ``route``."""
    if isinstance(exc, WorkerError):
        if exc.route is None:
            exc.route = route
    elif getattr(exc, "route", None) is None:  # a crash's exception: its result still names it
        setattr(exc, "route", route)  # noqa: B010
    return exc
