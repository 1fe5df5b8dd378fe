"""Dispatch one job: result cache, the decision (router, policy, circuits, budgets), local or
remote, failover, settlement."""

from .cache import CacheConfig, ResultCache, cacheable
from .decide import PEAK_DECAY, SHED_HORIZON_S, SHED_MARGIN_S, Decider
from .dispatcher import Dispatcher
from .plan import Dispatched, batch_items, chunked, failed_at
from .settings import DispatchSettings
from .sources import local_source, remote_sources, stream_sources

__all__ = (
    "CacheConfig",
    "Decider",
    "DispatchSettings",
    "Dispatched",
    "Dispatcher",
    "PEAK_DECAY",
    "ResultCache",
    "SHED_HORIZON_S",
    "SHED_MARGIN_S",
    "batch_items",
    "cacheable",
    "chunked",
    "failed_at",
    "local_source",
    "remote_sources",
    "stream_sources",
)
