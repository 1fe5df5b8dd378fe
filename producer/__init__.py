"""Producer side of overspill: the job contract, the client library, the HTTP API, batches, CLI.

Subpackages: ``contract`` (shared with workers), ``client``, ``batches``, ``api``; each imports
only those before it. Importing ``producer`` loads no web framework (``producer.api`` on demand)
and no client until ``producer.Client`` is asked for.
"""

from typing import TYPE_CHECKING, Any

from .contract import (
    ErrorInfo,
    InvalidBody,
    JobKind,
    JobOptions,
    JobResult,
    Lane,
    LimitExceeded,
    Route,
    Status,
    Timings,
)
from .errors import JobNotFound, JobTimeout, OverspillError

if TYPE_CHECKING:
    from .client import Client, SyncClient, VectorBlock


def __getattr__(name: str) -> Any:
    # The client library loads on first use: a worker imports producer.contract, which runs
    # this file, and must not pay for the client (redis scripts, coalescer) it never uses.
    if name in ("Client", "SyncClient", "VectorBlock"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'producer' has no attribute {name!r}")


__all__ = (
    "Client",
    "ErrorInfo",
    "InvalidBody",
    "JobKind",
    "JobNotFound",
    "JobOptions",
    "JobResult",
    "JobTimeout",
    "Lane",
    "LimitExceeded",
    "OverspillError",
    "Route",
    "Status",
    "SyncClient",
    "Timings",
    "VectorBlock",
)
