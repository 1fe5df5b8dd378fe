"""Prometheus metrics of the worker (served on ``OVERSPILL_METRICS_PORT``)."""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from producer.contract import JobResult, Route

_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)

JOBS = Counter("overspill_jobs_total", "Jobs finished", ["kind", "route", "status"])
ROUTES = Counter("overspill_route_decisions_total", "Routing decisions", ["route", "reason"])
BATCH_SIZE = Histogram(
    "overspill_batch_size", "Items per backend request", ["model"], buckets=(1, 2, 4, 8, 16, 32, 48, 64, 128)
)
BATCHES = Counter("overspill_batches_total", "Backend requests sent", ["model"])
QUEUE_MS = Histogram("overspill_queue_ms", "Submit to worker pick-up (ms)", ["lane"], buckets=_MS)
BATCH_WAIT_MS = Histogram("overspill_batch_wait_ms", "Wait in the micro-batcher (ms)", ["model"], buckets=_MS)
INFER_MS = Histogram("overspill_infer_ms", "Backend request duration (ms)", ["model"], buckets=_MS)
TOTAL_MS = Histogram("overspill_job_total_ms", "Submit to result written (ms)", ["kind"], buckets=_MS)
BACKLOG = Gauge("overspill_batcher_backlog", "Items waiting in a micro-batcher", ["model"])
QUEUE_DEPTH = Gauge("overspill_queue_depth", "Work packages queued per lane", ["lane"])
PACKAGES = Counter("overspill_packages_total", "Work packages run", ["lane", "outcome"])
STREAMS_OPEN = Gauge("overspill_streams_open", "Streamed jobs generating now", ["route"])
STREAM_TTFT_MS = Histogram(
    "overspill_stream_ttft_ms",
    "Streamed job start to its first token on the stream (ms)",
    ["route"],
    buckets=_MS,
)
STREAMS = Counter("overspill_streams_total", "Streamed jobs ended", ["route", "outcome"])


def observe_many(histogram: Any, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for every value, with one increment per bucket, not per value.

    prometheus_client takes a lock for each increment, and a work package observes tens of
    values at once. Buckets are found as ``observe`` finds them (the first bound >= value);
    a histogram without those internals is observed value by value.
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value in values:
            histogram.observe(value)
        return
    counts: dict[int, int] = {}
    for value in values:
        i = bisect_left(bounds, value)
        counts[i] = counts.get(i, 0) + 1
    for i, n in counts.items():
        buckets[i].inc(n)
    total.inc(sum(values))


def record_batch(model: str, size: int, infer_ms: float) -> None:
    BATCHES.labels(model).inc()
    BATCH_SIZE.labels(model).observe(size)
    INFER_MS.labels(model).observe(infer_ms)


PADDING = Histogram(
    "overspill_batch_padding_ratio",
    "Padded ÷ real tokens of a backend request (rows × longest row ÷ the rows' tokens)",
    ["model"],
    buckets=(1, 1.1, 1.25, 1.5, 2, 3, 4, 6, 8, 16),
)
BATCH_TOKENS = Counter("overspill_batch_tokens_total", "Tokens the local models processed", ["model"])


def record_tokens(model: str, tokens: Sequence[int]) -> None:
    """A request's token counts, as the model returned them: its padding, and tokens/s."""
    total = sum(tokens)
    if total > 0:
        BATCH_TOKENS.labels(model).inc(total)
        PADDING.labels(model).observe(len(tokens) * max(tokens) / total)


CIRCUIT_OPEN = Gauge("overspill_circuit_open", "1 while a backend's circuit is open", ["backend"])
OVERLOADED = Gauge("overspill_overloaded", "1 while a model's overflow gate is open", ["model"])
REMOTE_REQUESTS = Counter(
    "overspill_remote_requests_total", "HTTP requests sent to the remote", ["endpoint", "outcome"]
)
CACHE = Counter("overspill_cache_total", "Result cache look-ups", ["outcome"])
REMOTE_EMPTY = Counter(
    "overspill_remote_empty_replies_total",
    "Remote chat answers (200) with no content and no refusal",
    ["mode"],  # stream | plain
)
PROVIDER_RATE_FACTOR = Gauge(
    "overspill_provider_rate_factor",
    "Share of a remote's configured rate in use (a 429 halves it)",
    ["provider"],
)
PROVIDER_WAITS = Counter(
    "overspill_provider_limit_waits_total",
    "Remote calls that waited for the shared provider limits",
    ["provider"],
)
PROVIDER_CALLS = Counter(
    "overspill_provider_jobs_total", "Jobs sent to each remote, by outcome", ["provider", "outcome"]
)
USAGE_TOKENS = Counter(
    "overspill_usage_tokens_total",
    "Tokens booked in the usage ledger",
    ["tenant", "model", "route", "direction"],
)
POLICY_ERRORS = Counter(
    "overspill_policy_errors_total", "Routing policies refused (the one in force stays)", ["source"]
)
POLICY_RELOADS = Counter("overspill_policy_reloads_total", "Routing policies applied")
FILE_ERRORS = Counter(
    "overspill_config_file_errors_total",
    "Watched files refused, unreadable or invalid (the values in force stay)",
    ["file"],
)
POLICY_RATIO = Gauge("overspill_policy_remote_ratio", "The remote ratio in force")
POLICY_MODE = Gauge("overspill_policy_mode", "1 for the gateway mode in force", ["mode"])
POLICY_ROUTING = Gauge(
    "overspill_policy_routing", "1 for the routing in force (overflow | cost)", ["routing"]
)
USAGE_COST = Counter(
    "overspill_usage_cost_dollars_total", "Cost booked in the usage ledger", ["tenant", "route"]
)
WEBHOOK_DELIVERIES = Counter(
    "overspill_webhook_deliveries_total", "Webhook delivery attempts by outcome", ["outcome"]
)
WEBHOOK_HELD = Gauge(
    "overspill_webhook_deliveries_held",
    "Webhook deliveries this worker claimed and has not settled: waiting for a slot, or sending",
    ["state"],
)

GC_PAUSE_MS = Histogram(
    "overspill_gc_pause_ms",
    "Garbage collection pauses of the worker process (ms)",
    ["generation"],
    buckets=(0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500),
)


def install_gc_metrics() -> None:
    """Time every garbage collection: a long one stalls every job in the event loop at once."""
    started = [0.0]
    children = [GC_PAUSE_MS.labels(str(g)) for g in range(3)]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            children[min(info["generation"], 2)].observe((time.perf_counter() - started[0]) * 1000)

    gc.callbacks.append(on_gc)


def count_results(results: Sequence[JobResult], lane: str) -> None:
    """Metrics for results written together: one update per labelled series, not one per job."""
    counts: dict[tuple[str, str, str], int] = {}
    queued: list[float] = []
    waits: dict[str, list[float]] = {}
    totals: dict[str, list[float]] = {}
    for r in results:
        kind = r.kind.value
        key = (kind, (r.route or Route.local).value, r.status.value)
        counts[key] = counts.get(key, 0) + 1
        queued.append(r.timings.queued_ms)
        if r.model and r.timings.batch_size:
            waits.setdefault(r.model, []).append(r.timings.batch_ms)
        totals.setdefault(kind, []).append(r.timings.total_ms)
    observe_many(QUEUE_MS.labels(lane), queued)
    for model, values in waits.items():
        observe_many(BATCH_WAIT_MS.labels(model), values)
    for kind, values in totals.items():
        observe_many(TOTAL_MS.labels(kind), values)
    for labels, n in counts.items():
        JOBS.labels(*labels).inc(n)
