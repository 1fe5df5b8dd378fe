"""Dispatch one job: result cache, router, local or remote, failover, settlement."""

from .cache import CacheConfig, ResultCache, cacheable
from .dispatcher import Dispatched, Dispatcher, batch_items, chunked, failed_at

__all__ = (
    "CacheConfig",
    "Dispatched",
    "Dispatcher",
    "ResultCache",
    "batch_items",
    "cacheable",
    "chunked",
    "failed_at",
)
