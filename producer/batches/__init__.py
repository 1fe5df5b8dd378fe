"""The Batch engine: OpenAI Batch API semantics (files in, files out) over overspill's jobs.

Lives here: the engine and its driver, batch state, JSONL lines, the file store, ``overspill
bulk``. May import ``producer.contract``, ``producer.errors`` and ``producer.client``.
"""

from .driver import BatchDriver
from .engine import BatchEngine
from .files import CHUNK_BYTES, FileRecord, FileStore
from .lease import Lease, LeaseLost
from .lines import ENDPOINT_KINDS
from .state import ACTIVE, BatchSettings, BatchState, BatchStatus
from .store import BatchStore

__all__ = (
    "ACTIVE",
    "CHUNK_BYTES",
    "ENDPOINT_KINDS",
    "BatchDriver",
    "BatchEngine",
    "BatchSettings",
    "BatchState",
    "BatchStatus",
    "BatchStore",
    "FileRecord",
    "FileStore",
    "Lease",
    "LeaseLost",
)
