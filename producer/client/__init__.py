"""The client library: submit jobs to Redis, wait for or poll their results, cancel them.

Lives here: ``Client`` (asyncio), ``SyncClient``, the coalescer that packs concurrent submits
and the reply listener. May import ``producer.contract`` and ``producer.errors`` only.
"""

from .arrays import VectorBlock
from .client import Client, PipelineHook, Request
from .sync import SyncClient

__all__ = ("Client", "PipelineHook", "Request", "SyncClient", "VectorBlock")
