"""The result envelope: what ``get``/``wait`` return and what a webhook receives."""

from __future__ import annotations

import functools
from typing import Any, TypeVar

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
    # Embedding vectors in ``body`` are base64 while stored; the caller asked for floats and
    # readers unpack them (producer/contract/vectors.py). Last, so ``body`` still precedes
    # ``timings`` in the JSON (the batch writer slices it out).
    packed_vectors: bool | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def vectors(self) -> Any:
        """An embedding job's vectors as a float32 ``numpy`` array ``[inputs, dimensions]``
        (empty unless it succeeded)."""
        from .vectors import matrix_of  # vectors.py reads envelopes: imported when asked

        return matrix_of(self.body if self.status == Status.succeeded else None)


M = TypeVar("M", bound=BaseModel)


@functools.cache
def _field_count(cls: type[BaseModel]) -> int:
    # ``model_fields`` is a Python-level property in pydantic 2.11+: 3 % of a bulk worker's CPU
    # when read per result.
    return len(cls.model_fields)


def trusted(cls: type[M], values: dict[str, Any]) -> M:
    """An instance of ``cls`` from ``values`` for *every* field, already valid (the worker's
    own results): no validation, and none of ``model_construct``'s per-field Python loop,
    which a profile of a worker under bulk load showed at 8 % of its CPU."""
    if len(values) != _field_count(cls):
        missing = set(cls.model_fields) - set(values)
        raise TypeError(f"trusted {cls.__name__} needs every field; missing {sorted(missing)}")
    obj = cls.__new__(cls)
    object.__setattr__(obj, "__dict__", values)
    object.__setattr__(obj, "__pydantic_fields_set__", set(values))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj
