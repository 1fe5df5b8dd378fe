"""Worker side of overspill: arq tasks, micro-batchers, backends and routing.

Imports from ``producer`` are limited to its contract package, ``producer.contract``.
"""

from .backends.local.batcher import MicroBatcher, Outcome
from .core.errors import (
    BackendError,
    BackendUnavailable,
    InferenceFailed,
    InvalidRequest,
    ItemError,
    ModelError,
    ModelNotFound,
    WorkerError,
)
from .core.settings import ModelSpec, WorkerConfig

__all__ = (
    "BackendError",
    "BackendUnavailable",
    "InferenceFailed",
    "InvalidRequest",
    "ItemError",
    "MicroBatcher",
    "ModelError",
    "ModelNotFound",
    "ModelSpec",
    "Outcome",
    "WorkerConfig",
    "WorkerError",
)
