"""The worker's status report, for the operations console (``GET /console`` on the API).

Every second each worker writes one field of ``Keys.worker_status()``: what it runs per lane,
its overflow gates and the signals holding them open, its breakers, the Triton replicas and
remote providers as it sees them. The report is current until its ``until``, so a dead
worker's report goes stale by itself. It also adds what it finished since the last report to
the shared ``Keys.activity`` slice of the current 10 s (jobs per route, items per lane), from
which the console charts the route split and items/s without a single per-job Redis command.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from arq.worker import Worker
from prometheus_client import Counter, Gauge, Histogram

from producer.contract import ACTIVITY_BUCKET_S, ACTIVITY_KEEP_S, Keys, Lane

from ..backends.local.replicas import (
    REPLICA_GPU,
    REPLICA_OUTSTANDING,
    REPLICA_PENDING,
    REPLICA_QUEUE_MS,
    REPLICA_READY,
)
from ..core.metrics import BACKLOG, CIRCUIT_OPEN, JOBS, PROVIDER_RATE_FACTOR, QUEUE_MS, STREAMS_OPEN
from ..core.periodic import Periodic
from ..jobs.task import WorkerState
from ..queue.worker import PackageWorker
from ..routing.signals import prune_reports

# The gauges the console shows, by the short name it knows them by.
GAUGES: dict[str, Gauge] = {
    "circuit_open": CIRCUIT_OPEN,
    "replica_ready": REPLICA_READY,
    "replica_outstanding": REPLICA_OUTSTANDING,
    "replica_pending": REPLICA_PENDING,
    "replica_queue_ms": REPLICA_QUEUE_MS,
    "replica_gpu": REPLICA_GPU,
    "provider_rate_factor": PROVIDER_RATE_FACTOR,
    "backlog": BACKLOG,
    "streams_open": STREAMS_OPEN,
}
STALE_AFTER_S = 5.0  # a report counts this long: a few missed seconds, not a dead worker


def gauge_rows(gauge: Gauge) -> list[dict[str, Any]]:
    """A gauge's series as ``[{label: value, ..., "value": v}]``."""
    return [{**s.labels, "value": s.value} for metric in gauge.collect() for s in metric.samples]


def totals_by(metric: Counter | Histogram, sample: str, label: str) -> dict[str, float]:
    """The sum of ``metric``'s ``sample`` series (e.g. ``…_total``, ``…_count``) per ``label``."""
    out: dict[str, float] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name == sample:
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def activity_totals() -> dict[str, float]:
    """What this process finished so far: ``route:<r>`` jobs and ``lane:<l>`` items picked up."""
    routes = totals_by(JOBS, "overspill_jobs_total", "route")
    lanes = totals_by(QUEUE_MS, "overspill_queue_ms_count", "lane")
    return {**{f"route:{k}": v for k, v in routes.items()}, **{f"lane:{k}": v for k, v in lanes.items()}}


def deltas(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0.0)) for k, v in now.items() if int(v - before.get(k, 0.0)) > 0}


class StatusReporter:
    """Writes this worker's report and activity every ``interval_s``; prunes dead workers' reports."""

    def __init__(
        self,
        redis: Any,
        keys: Keys,
        state: WorkerState,
        workers: Sequence[Worker],
        interval_s: float = 1.0,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._state = state
        by_queue = {w.queue_name: w for w in workers if isinstance(w, PackageWorker)}
        self._lanes = {lane: by_queue[keys.queue(lane)] for lane in Lane if keys.queue(lane) in by_queue}
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.started_at = time.time()
        self._sent = activity_totals()  # counted before start-up belongs to no slice
        self._pruned_at = 0.0
        self._task = Periodic("status report", self.report, interval_s)

    def start(self) -> None:
        self._task.start()

    async def aclose(self) -> None:
        await self._task.aclose()
        await self._redis.hdel(self._keys.worker_status(), self.worker_id)

    def document(self, now: float) -> dict[str, Any]:
        load = self._state.dispatch.load
        models = list(self._state.local.batchers)
        lanes = {
            lane.value: {
                "packages": sum(1 for t in worker.tasks.values() if not t.done()),
                "items_in_flight": sum(load.inflight(m, lane) for m in models),
                "last_claim_at": worker.last_claim_at,
            }
            for lane, worker in self._lanes.items()
        }
        return {
            "worker": self.worker_id,
            "at": round(now, 3),
            "until": round(now + STALE_AFTER_S, 3),
            "started_at": round(self.started_at, 3),
            "draining": self._state.draining,
            "lanes": lanes,
            "gates": self._state.dispatch.router.gate_signals(),
            "gauges": {name: gauge_rows(g) for name, g in GAUGES.items()},
        }

    async def report(self) -> None:
        now = time.time()
        totals = activity_totals()
        moved = deltas(totals, self._sent)
        slice_key = self._keys.activity(int(now // ACTIVITY_BUCKET_S))
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(self._keys.worker_status(), self.worker_id, json.dumps(self.document(now)))
            for name, n in moved.items():
                pipe.hincrby(slice_key, name, n)
            if moved:
                pipe.expire(slice_key, ACTIVITY_KEEP_S)
            await pipe.execute()
        self._sent = totals  # only once written: a failed write is counted in the next slice
        if now - self._pruned_at > 60:
            self._pruned_at = now
            await prune_reports(self._redis, self._keys.worker_status(), now)  # only a live worker prunes
