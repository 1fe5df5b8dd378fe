"""Producer side of overspill: the job contract, the client library, the HTTP API and CLI.

Importing this package pulls in no web framework: ``producer.api`` is imported on demand.
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
