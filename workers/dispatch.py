"""Dispatch one job: result cache → router → local Triton or the remote, with failover.

Failover runs both ways within the job: Triton unavailable → the remote, if the job may go
there; the remote failing past its retries → local. Each backend has a circuit breaker, so
once one is known to be down, later jobs skip it instead of each discovering it. A job that
can reach neither raises :class:`BackendUnavailable` and the package re-queues it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from producer.jobs import ChatRequest, EmbeddingRequest, Keys, RerankRequest, Route, WorkItem

from .cache import CacheConfig, ResultCache
from .circuit import CircuitBreaker
from .errors import BackendUnavailable, ItemError, RemoteUnavailable
from .handlers import Answer, LocalHandlers
from .local import TritonBackend
from .logs import get_logger
from .metrics import ROUTES
from .remote import RemoteBackend, RemoteConfig, RemoteHandlers
from .router import Health, JobView, Router, RouterConfig
from .settings import ModelSpec, WorkerConfig
from .signals import LocalLoad, Sampler, Snapshot

log = get_logger(__name__)


@dataclass(slots=True)
class Dispatched:
    answer: Answer
    route: Route
    reason: str


def batch_items(request: Any) -> int:
    """How many batcher items a request becomes (the unit of local load)."""
    if isinstance(request, EmbeddingRequest):
        return len(request.texts())
    if isinstance(request, RerankRequest):
        return len(request.documents)
    return 1 if isinstance(request, ChatRequest) else 0


class Dispatcher:
    def __init__(
        self,
        config: WorkerConfig,
        redis: Any,
        local: LocalHandlers,
        triton: TritonBackend,
        *,
        router_config: RouterConfig | None = None,
        remote_config: RemoteConfig | None = None,
        cache_config: CacheConfig | None = None,
    ) -> None:
        rc = router_config or RouterConfig()
        self.remote_config = remote_config or RemoteConfig()
        cc = cache_config or CacheConfig()
        keys = Keys(config.prefix)
        self.local = local
        self.remote: RemoteHandlers | None = None
        if self.remote_config.enabled:
            self.remote = RemoteHandlers(config, self.remote_config, RemoteBackend(self.remote_config))
        self.router = Router(rc, {s.name: s.triton_model for s in config.models})
        self.triton_circuit = CircuitBreaker(
            "triton", failures=rc.triton_circuit_failures, reset_after_s=rc.triton_circuit_reset_s
        )
        self.remote_circuit = CircuitBreaker(
            "remote",
            failures=self.remote_config.circuit_failures,
            reset_after_s=self.remote_config.circuit_reset_s,
        )
        self.cache = ResultCache(redis, keys, cc.ttl_s) if cc.enabled else None
        self.load = LocalLoad()
        self.sampler = Sampler(
            redis=redis,
            keys=keys,
            lanes=config.lanes,
            backlog=local.backlog,
            triton_ready=triton.ready,
            metrics_url=config.triton_metrics_url,
            load=self.load,
            models=[s.name for s in config.models],
            publish=self._observe,
            interval_s=rc.sample_interval_s,
        )

    def start(self) -> None:
        self.sampler.start()

    async def aclose(self) -> None:
        await self.sampler.aclose()
        if self.remote is not None:
            await self.remote.aclose()

    def _observe(self, snap: Snapshot) -> None:
        self.router.observe(snap)
        if not snap.triton_ready:
            self.triton_circuit.trip()

    # ------------------------------------------------------------------ one job

    async def run(self, item: WorkItem) -> Dispatched:
        self.start()
        request, spec = self.local.resolve(item)
        if self.cache is not None:
            hit = await self.cache.get(item)
            if hit is not None:
                ROUTES.labels(Route.cache.value, "cache").inc()
                return Dispatched(hit, Route.cache, "cache")
        route, reason = self._decide(item, spec)
        answer, route, reason = await self._execute(item, request, spec, route, reason)
        ROUTES.labels(route.value, reason).inc()
        if self.cache is not None:
            await self.cache.put(item, answer)
        return Dispatched(answer, route, reason)

    def _eligible(self, item: WorkItem, spec: ModelSpec) -> bool:
        return self.remote is not None and not item.local_only and self.remote_config.serves(spec)

    def _decide(self, item: WorkItem, spec: ModelSpec) -> tuple[Route, str]:
        eligible = self._eligible(item, spec)
        job = JobView(
            model=spec.name,
            lane=item.lane,
            route=item.route,
            local_only=item.local_only,
            seconds_left=item.deadline_at - time.time(),
            eligible=eligible,
        )
        health = Health(
            triton_ok=self.triton_circuit.allow(), remote_ok=eligible and self.remote_circuit.allow()
        )
        rate = self.sampler.latest.local_rate.get(spec.name)
        wait_s = self.load.estimated_wait_s(spec.name, rate, item.lane)
        return self.router.decide(job, health, wait_s)

    async def _execute(
        self, item: WorkItem, request: Any, spec: ModelSpec, route: Route, reason: str
    ) -> tuple[Answer, Route, str]:
        if route == Route.remote:
            try:
                return await self._remote(item, request, spec), route, reason
            except RemoteUnavailable as exc:
                log.warning("remote failed; the job runs locally", error=exc.message)
                return await self._local(item, request, spec), Route.local, "failover"
        try:
            return await self._local(item, request, spec), route, reason
        except BackendUnavailable as exc:
            if not self._may_fail_over(item, spec):
                raise
            log.warning("Triton unavailable; the job fails over to the remote", error=exc.message)
            return await self._remote(item, request, spec), Route.remote, "failover"

    def _may_fail_over(self, item: WorkItem, spec: ModelSpec) -> bool:
        if item.route == "local" or self.router.config.gateway_mode == "triton":
            return False
        return self._eligible(item, spec) and self.remote_circuit.allow()

    async def _local(self, item: WorkItem, request: Any, spec: ModelSpec) -> Answer:
        token = self.load.begin(spec.name, batch_items(request), item.lane)
        done = False
        try:
            answer = await self.local.run(item, (request, spec))
            done = True
        except ItemError:
            done = True  # Triton answered: it is up, and the work took its capacity
            self.triton_circuit.record_success()
            raise
        except BackendUnavailable:
            self.triton_circuit.record_failure()
            raise
        finally:
            self.load.end(spec.name, token, done=done)
        self.triton_circuit.record_success()
        return answer

    async def _remote(self, item: WorkItem, request: Any, spec: ModelSpec) -> Answer:
        assert self.remote is not None
        try:
            answer = await self.remote.run(item, request, spec)
        except RemoteUnavailable:
            self.remote_circuit.record_failure()
            raise
        self.remote_circuit.record_success()
        return answer
