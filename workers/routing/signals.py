"""Load signals for the router, sampled in the background (never a scrape per job).

Every ``interval_s`` the :class:`Sampler` reads: the arq queue depth per lane (ZCARD of
each lane's queue), this worker's batcher backlog, Triton's ``/metrics`` (pending requests
and queue time per execution per model, GPU utilisation when present), Triton readiness,
and the local completion rate per model from :class:`LocalLoad`. It hands each
:class:`Snapshot` to a callback (the router). The one live figure is :class:`LocalLoad`'s
in-flight count, an in-process counter, from which a job's local wait is estimated.

With several Triton replicas, ``metrics_url`` lists each one's ``/metrics`` (comma-separated):
each is read, published with a ``replica`` label, and combined per model (pending requests
summed, queue time per execution over all replicas' executions, GPU use averaged).

Each sample also publishes Triton readiness: the ``overspill_triton_ready`` gauge, and this
worker's field in the :meth:`Keys.readiness` hash that the API's ``/readyz`` reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import Gauge

from producer.contract import Keys, Lane, get_logger

from ..backends.local.replicas import REPLICA_GPU, REPLICA_PENDING, REPLICA_QUEUE_MS
from ..core.periodic import Periodic

log = get_logger(__name__)

TRITON_READY = Gauge("overspill_triton_ready", "1 while Triton answers this worker's readiness probe")

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+([-+0-9.eE]+|NaN|[+-]Inf)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format → (name, labels, value) samples."""
    samples = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(3) or ""))
            samples.append((m.group(1), labels, float(m.group(4))))
    return samples


@dataclass(slots=True)
class ModelCounters:
    """Cumulative per-model counters from Triton (sum over versions)."""

    requests: float = 0.0  # nv_inference_request_success
    inferences: float = 0.0  # nv_inference_count: items
    executions: float = 0.0  # nv_inference_exec_count: batches the model ran
    queue_us: float = 0.0  # nv_inference_queue_duration_us
    pending: float = 0.0  # nv_inference_pending_request_count (a gauge)
    compute_us: float = 0.0  # nv_inference_compute_infer_duration_us

    @property
    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0


_FIELDS = {
    "nv_inference_request_success": "requests",
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_pending_request_count": "pending",
    "nv_inference_compute_infer_duration_us": "compute_us",
}


def model_counters(text: str) -> dict[str, ModelCounters]:
    out: dict[str, ModelCounters] = {}
    for name, labels, value in parse_metrics(text):
        field = _FIELDS.get(name)
        if field and "model" in labels:
            counters = out.setdefault(labels["model"], ModelCounters())
            setattr(counters, field, getattr(counters, field) + value)
    return out


def gpu_utilization(text: str) -> float | None:
    """Mean ``nv_gpu_utilization`` over GPUs (0–1), or None on a CPU-only server."""
    values = [v for name, _, v in parse_metrics(text) if name == "nv_gpu_utilization"]
    return sum(values) / len(values) if values else None


def queue_ms_per_exec(before: ModelCounters, now: ModelCounters) -> float:
    """Queue time per execution over an interval (SuperSONIC's saturation metric), in ms."""
    executions = now.executions - before.executions
    if executions <= 0:
        return 0.0
    return max(now.queue_us - before.queue_us, 0.0) / executions / 1000


# ---------------------------------------------------------------------------- local load


_LANES = tuple(Lane)  # iterating an Enum class is slow on the per-job path


class LocalLoad:
    """Items this worker has in flight locally, per model and lane, and how many it completed.

    Little's law turns these into an estimated wait: items ahead / completion rate. The
    batchers serve interactive items first, so an interactive job waits only behind
    interactive items, while a bulk job waits behind everything.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ids = itertools.count()
        self._inflight: dict[str, dict[int, tuple[float, int, Lane]]] = {}
        self._totals: dict[tuple[str, Lane], int] = {}
        self.completed: dict[str, int] = {}

    def begin(self, model: str, items: int, lane: Lane = Lane.interactive) -> int:
        token = next(self._ids)
        self._inflight.setdefault(model, {})[token] = (self._clock(), items, lane)
        self._totals[model, lane] = self._totals.get((model, lane), 0) + items
        return token

    def end(self, model: str, token: int, *, done: bool) -> None:
        entry = self._inflight.get(model, {}).pop(token, None)
        if entry is None:
            return
        _, items, lane = entry
        self._totals[model, lane] -= items
        if done:
            self.completed[model] = self.completed.get(model, 0) + items

    def inflight(self, model: str, lane: Lane | None = None) -> int:
        """Items in flight for ``model``: of one lane, or of all lanes when ``lane`` is None."""
        lanes = _LANES if lane is None else (lane,)
        return sum(self._totals.get((model, ln), 0) for ln in lanes)

    def ahead_of(self, model: str, lane: Lane) -> int:
        """Items a new job of ``lane`` queues behind."""
        return self.inflight(model, Lane.interactive if lane == Lane.interactive else None)

    def oldest_age_s(self, model: str, lane: Lane | None = None) -> float:
        ages = [t for t, _, ln in self._inflight.get(model, {}).values() if lane is None or ln == lane]
        return self._clock() - min(ages) if ages else 0.0

    def estimated_wait_s(self, model: str, rate: float | None, lane: Lane = Lane.bulk) -> float:
        """Local wait a new job of ``model`` and ``lane`` can expect; 0 without evidence of any.

        The default, bulk, counts every item in flight: the wait of the local side as a whole.
        """
        ahead = self.ahead_of(model, lane)
        if not ahead:
            return 0.0
        if rate:
            return ahead / rate
        # Nothing finished lately: at least as long as the oldest item ahead has waited.
        return self.oldest_age_s(model, Lane.interactive if lane == Lane.interactive else None)


# ---------------------------------------------------------------------------- sampler


@dataclass(slots=True)
class Snapshot:
    """One sample of every signal the router reads."""

    at: float = 0.0
    queue_depth: dict[str, int] = field(default_factory=dict)  # lane → packages waiting
    backlog: int = 0  # items waiting in this worker's batchers
    pending: dict[str, float] = field(default_factory=dict)  # Triton model → pending requests
    queue_ms: dict[str, float] = field(default_factory=dict)  # Triton model → queue ms per exec
    gpu_util: float | None = None
    triton_ready: bool = True
    local_rate: dict[str, float] = field(default_factory=dict)  # model → items/s completed
    wait_ms: dict[str, float] = field(default_factory=dict)  # model → estimated local wait


class Sampler:
    """Samples the signals every ``interval_s`` and passes each snapshot to ``publish``."""

    def __init__(
        self,
        *,
        redis: Any,
        keys: Keys,
        lanes: Sequence[Lane],
        backlog: Callable[[], int],
        triton_ready: Callable[[], Awaitable[bool]],
        metrics_url: str,
        load: LocalLoad,
        models: Sequence[str],
        publish: Callable[[Snapshot], None],
        interval_s: float = 0.5,
        rate_window_s: float = 2.0,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._lanes = list(lanes)
        self._backlog = backlog
        self._triton_ready = triton_ready
        self._metrics_urls = [u.strip() for u in metrics_url.split(",") if u.strip()]
        self._load = load
        self._models = list(models)
        self._publish = publish
        self.interval_s = interval_s
        self._window_s = rate_window_s
        self._history: deque[tuple[float, dict[str, int]]] = deque()
        self._counters: dict[str, dict[str, ModelCounters]] = {}  # metrics URL -> model -> counters
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(1.0))
        self._task = Periodic("signal sample", self.sample, lambda: self.interval_s)
        self.latest = Snapshot(at=time.monotonic())
        self._worker_id = f"{socket.gethostname()}:{os.getpid()}"
        # A report outlives a few samples (one may take ~3 s while Triton hangs), not a dead worker.
        self._report_ttl_s = max(5.0, 4 * interval_s)
        self._pruned_at = 0.0

    def start(self) -> None:
        """Start sampling (idempotent); the first sample is taken at once."""
        self._task.start()

    async def aclose(self) -> None:
        await self._task.aclose()
        await self._http.aclose()

    async def sample(self) -> Snapshot:
        snap = Snapshot(at=time.monotonic(), backlog=self._backlog())
        snap.queue_depth = await self._queue_depths()
        snap.triton_ready = await self._triton_ready()
        await self._read_triton(snap)
        snap.local_rate = self._rates(snap.at)
        for model in self._models:
            wait_s = self._load.estimated_wait_s(model, snap.local_rate.get(model))
            snap.wait_ms[model] = wait_s * 1000
        self.latest = snap
        self._publish(snap)
        await self._report_readiness(snap)
        return snap

    async def _report_readiness(self, snap: Snapshot) -> None:
        """This worker's field of the readiness hash: ``{triton_ready, until}``, ``until`` an epoch
        after which the report no longer counts (so a dead worker's report goes stale by itself)."""
        TRITON_READY.set(1 if snap.triton_ready else 0)
        key = self._keys.readiness()
        now = time.time()
        record = json.dumps({"triton_ready": snap.triton_ready, "until": round(now + self._report_ttl_s, 3)})
        with contextlib.suppress(Exception):  # Redis down: there is no one to tell
            await self._redis.hset(key, self._worker_id, record)
            if now - self._pruned_at > 60:
                # Fields of workers gone for a minute are dropped. Only a live worker prunes,
                # so the hash is never emptied while every worker is down.
                self._pruned_at = now
                await prune_reports(self._redis, key, now)

    async def _queue_depths(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with contextlib.suppress(Exception):
            async with self._redis.pipeline(transaction=False) as pipe:
                for lane in self._lanes:
                    pipe.zcard(self._keys.queue(lane))
                depths = await pipe.execute()
            out = {lane.value: int(d) for lane, d in zip(self._lanes, depths, strict=True)}
        return out

    async def _read_triton(self, snap: Snapshot) -> None:
        texts = await asyncio.gather(*(self._scrape(u) for u in self._metrics_urls))
        queued: dict[str, list[float]] = {}  # model -> [queue µs, executions] over every replica
        gpus: list[float] = []
        for url, text in zip(self._metrics_urls, texts, strict=True):
            if text is None:
                continue
            replica = httpx.URL(url).netloc.decode()
            now = model_counters(text)
            before = self._counters.get(url, {})
            for model, counters in now.items():
                snap.pending[model] = snap.pending.get(model, 0.0) + counters.pending
                REPLICA_PENDING.labels(replica, model).set(counters.pending)
                if model in before:
                    REPLICA_QUEUE_MS.labels(replica, model).set(queue_ms_per_exec(before[model], counters))
                    total = queued.setdefault(model, [0.0, 0.0])
                    total[0] += max(counters.queue_us - before[model].queue_us, 0.0)
                    total[1] += max(counters.executions - before[model].executions, 0.0)
            self._counters[url] = now
            if (gpu := gpu_utilization(text)) is not None:
                gpus.append(gpu)
                REPLICA_GPU.labels(replica).set(gpu)
        for model, (queue_us, executions) in queued.items():
            snap.queue_ms[model] = queue_us / executions / 1000 if executions > 0 else 0.0
        snap.gpu_util = sum(gpus) / len(gpus) if gpus else None

    async def _scrape(self, url: str) -> str | None:
        try:
            response = await self._http.get(url)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        return response.text

    def _rates(self, at: float) -> dict[str, float]:
        """Items/s completed locally per model over the last ``rate_window_s``."""
        self._history.append((at, dict(self._load.completed)))
        while len(self._history) > 2 and at - self._history[1][0] >= self._window_s:
            self._history.popleft()
        then, before = self._history[0]
        span = at - then
        if span <= 0:
            return {}
        now = self._history[-1][1]
        return {m: (n - before.get(m, 0)) / span for m, n in now.items()}


async def prune_reports(redis: Any, key: str, now: float, gone_s: float = 60.0) -> None:
    """Drop the fields of a hash of per-worker JSON reports (``{..., "until": epoch}``) whose
    worker has been gone for ``gone_s``: the readiness hash, the console's status hash."""
    stale = [f for f, raw in (await redis.hgetall(key)).items() if _until(raw) < now - gone_s]
    if stale:
        await redis.hdel(key, *stale)


def _until(raw: bytes | str) -> float:
    try:
        return float(json.loads(raw)["until"])
    except (ValueError, KeyError, TypeError):
        return 0.0
