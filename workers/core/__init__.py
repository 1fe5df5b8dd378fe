"""The worker's foundations: errors, settings, metrics, and the small mechanisms every room uses
(a file watcher, periodic steps, circuit breakers, a package's progress clock).
"""

from .circuit import CircuitBreaker, CircuitState
from .endpoints import Endpoint, Role, parse_endpoints
from .errors import (
    BackendError,
    BackendUnavailable,
    BudgetExceeded,
    DeadlineShed,
    InferenceFailed,
    InvalidRequest,
    ItemError,
    ModelError,
    ModelNotFound,
    RemoteBadResponse,
    RemoteLacks,
    RemoteRejected,
    RemoteUnavailable,
    StreamCancelled,
    StreamDiverged,
    StreamInterrupted,
    WorkerError,
)
from .metrics import install_gc_metrics, observe_many, record_batch, record_tokens
from .periodic import Periodic
from .progress import Liveness, PackageClock, mark, within
from .retry_after import retry_after_s
from .settings import ModelSpec, WorkerConfig
from .watched import WatchedFile

__all__ = (
    "BackendError",
    "BackendUnavailable",
    "BudgetExceeded",
    "CircuitBreaker",
    "CircuitState",
    "DeadlineShed",
    "Endpoint",
    "InferenceFailed",
    "InvalidRequest",
    "ItemError",
    "Liveness",
    "ModelError",
    "ModelNotFound",
    "ModelSpec",
    "PackageClock",
    "Periodic",
    "RemoteBadResponse",
    "RemoteLacks",
    "RemoteRejected",
    "RemoteUnavailable",
    "Role",
    "StreamCancelled",
    "StreamDiverged",
    "StreamInterrupted",
    "WatchedFile",
    "WorkerConfig",
    "WorkerError",
    "install_gc_metrics",
    "mark",
    "observe_many",
    "parse_endpoints",
    "record_batch",
    "record_tokens",
    "retry_after_s",
    "within",
)
