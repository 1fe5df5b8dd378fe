"""Per-tenant load of each lane on ``/metrics``: read from Redis when Prometheus scrapes.

Every worker sees the same Redis, so these come from the API (one source), not from each
worker. KEDA's metric stays the lane's total (``overspill_queue_depth``, from the workers).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.exceptions import RedisError

from ..contract import Keys, TenantLoad, read_tenant_load


class TenantLoadCollector:
    """Holds the last read; :meth:`refresh` reads again before each scrape is rendered."""

    def __init__(self) -> None:
        self.rows: list[TenantLoad] = []

    async def refresh(self, redis: Any, keys: Keys) -> None:
        try:
            self.rows = await read_tenant_load(redis, keys)
        except (RedisError, OSError):  # Redis restarting: the scrape shows no tenant rows
            self.rows = []

    def collect(self) -> Iterator[Metric]:
        labels = ["lane", "tenant"]
        queued = GaugeMetricFamily(
            "overspill_tenant_queued_items", "Items lined up per tenant", labels=labels
        )
        flight = GaugeMetricFamily(
            "overspill_tenant_items_in_flight", "Items claimed, not finished", labels=labels
        )
        rate = GaugeMetricFamily(
            "overspill_tenant_items_per_second", "Items claimed per second lately", labels=labels
        )
        oldest = GaugeMetricFamily(
            "overspill_tenant_oldest_wait_seconds",
            "Age of the tenant's oldest lined-up package",
            labels=labels,
        )
        served = CounterMetricFamily(
            "overspill_tenant_items_claimed", "Items claimed per tenant", labels=labels
        )
        for r in self.rows:
            key = [r.lane, r.tenant]
            queued.add_metric(key, r.queued_items)
            flight.add_metric(key, r.items_in_flight)
            rate.add_metric(key, r.items_per_s)
            served.add_metric(key, r.items_served)
            if r.oldest_wait_s is not None:
                oldest.add_metric(key, r.oldest_wait_s)
        yield from (queued, flight, rate, oldest, served)


TENANT_LOAD = TenantLoadCollector()
REGISTRY.register(TENANT_LOAD)  # type: ignore[arg-type]
