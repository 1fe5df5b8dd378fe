"""The arq task that runs a work package, its result writer, and the Redis job store."""

from .package import Unavailable, decode_items, package_payload, raw_items, timed
from .store import JobStore
from .task import WorkerState, run_items, run_unknown_task
from .writer import Outcomes, ResultWriter

__all__ = (
    "JobStore",
    "Outcomes",
    "ResultWriter",
    "Unavailable",
    "WorkerState",
    "decode_items",
    "package_payload",
    "raw_items",
    "run_items",
    "run_unknown_task",
    "timed",
)
