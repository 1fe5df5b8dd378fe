"""The result envelope: what ``get``/``wait`` return and what a webhook receives."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from .kinds import TERMINAL, JobKind, Route, Status


class ErrorInfo(BaseModel):
    type: str
    message: str


class Timings(BaseModel):
    queued_ms: float = 0.0  # created → picked up by a worker
    batch_ms: float = 0.0  # waiting in the micro-batcher
    infer_ms: float = 0.0  # the backend call that carried this job
    batch_size: int = 0  # items in that backend call
    total_ms: float = 0.0  # created → result written


class JobResult(BaseModel):
    """The result envelope: what ``get``/``wait`` return and what a webhook receives."""

    id: str
    kind: JobKind
    status: Status
    tenant: str = "default"
    route: Route | None = None
    route_reason: str | None = None
    model: str | None = None
    body: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    timings: Timings = Field(default_factory=Timings)
    attempts: int = 0
    created_at: float
    finished_at: float | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL
