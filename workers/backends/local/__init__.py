"""The local backend: Triton over gRPC, its replicas, the micro-batcher, and per-kind handlers."""

from .batcher import MicroBatcher, Outcome
from .handlers import ItemError, LocalHandlers
from .replicas import Replica, ReplicaSet
from .triton import TritonBackend

__all__ = (
    "ItemError",
    "LocalHandlers",
    "MicroBatcher",
    "Outcome",
    "Replica",
    "ReplicaSet",
    "TritonBackend",
)
