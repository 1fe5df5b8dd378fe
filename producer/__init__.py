"""Producer side of overspill: the job contract, the client library, the HTTP API, batches, CLI.

Subpackages: ``contract`` (shared with workers), ``client``, ``batches``, ``api``; each imports
only those before it. Importing ``producer`` loads no web framework (``producer.api`` on demand).
"""

from .client import Client, SyncClient
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
)
