"""Dispatch one job: result cache → router → local Triton or the remote, with failover.

Failover runs both ways within the job: Triton unavailable → the remote, if the job may go
there; the remote failing past its retries → local. Each backend has a circuit breaker, so
once one is known to be down, later jobs skip it instead of each discovering it. A job that
can reach neither raises :class:`BackendUnavailable` and the package re-queues it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from producer.contract import (
    ChatRequest,
    EmbeddingRequest,
    Keys,
    RerankRequest,
    Route,
    RoutingPolicy,
    WorkItem,
    get_logger,
)

from ..accounting.budgets import Budgets
from ..accounting.ledger import Ledger
from ..backends.base import Answer
from ..backends.local.handlers import LocalHandlers
from ..backends.local.triton import TritonBackend
from ..backends.remote.config import RemoteConfig
from ..backends.remote.providers import ProvidersConfig, ProvidersFile, RemotePool, load_providers
from ..core.circuit import CircuitBreaker
from ..core.errors import (
    BackendUnavailable,
    BudgetExceeded,
    DeadlineShed,
    InvalidRequest,
    ItemError,
    RemoteLacks,
    RemoteUnavailable,
)
from ..core.metrics import ROUTES
from ..core.settings import ModelSpec, WorkerConfig
from ..routing.policy import PolicyWatcher, worker_id
from ..routing.router import Health, JobView, Router, RouterConfig
from ..routing.signals import LocalLoad, Sampler, Snapshot
from ..streaming.chat import StreamedChat, stream_sources
from .cache import CacheConfig, ResultCache

log = get_logger(__name__)


_HEALTHY = Health()
_REMOTE_ONLY_LOCAL = "model {!r} is served only by a remote; local_only or route 'local' cannot run it"
# Shedding by deadline looks only at jobs this close to their deadline, and sheds only when the
# estimated wait passes it by this margin (an estimate, so it errs towards running the job).
SHED_HORIZON_S = 30.0
SHED_MARGIN_S = 1.0
PEAK_DECAY = 0.98  # per signal sample (2 a second): the remembered peak halves in about 17 s


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


_Plan = tuple[int, WorkItem, Any, ModelSpec, str]  # index, job, its request, its model, route reason


def chunked(group: list[_Plan], limit: int) -> list[list[_Plan]]:
    """Consecutive chunks of ``group`` of at most ``limit`` backend inputs each (a job whose
    inputs alone pass the limit is a chunk of its own)."""
    chunks: list[list[_Plan]] = []
    size = 0
    for entry in group:
        n = batch_items(entry[2])
        if not chunks or size + n > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += n
    return chunks


def failed_at(exc: Exception, route: Route) -> Exception:
    """Note where a job failed (the first backend to fail it), for its result's ``route``."""
    if getattr(exc, "route", None) is None:
        exc.route = route  # type: ignore[attr-defined]
    return exc


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
        providers: ProvidersFile | None = None,
    ) -> None:
        rc = router_config or RouterConfig()
        self.remote_config = remote_config or RemoteConfig()
        cc = cache_config or CacheConfig()
        keys = Keys(config.prefix)
        self.local = local
        if providers is None and (path := ProvidersConfig().providers_file) is not None:
            providers = load_providers(path)  # a bad file stops the worker here, with its reason
        pool = RemotePool.build(config, redis, self.remote_config, providers)
        self.remote: RemotePool | None = pool if pool.enabled else None
        self.config = config
        self.ledger = Ledger(redis, keys, pool.price, pool.local_price)
        self.budgets = Budgets(redis, keys, self.ledger)
        self._backends: dict[str, str] = {}
        self.policy = PolicyWatcher(redis, keys, rc, self._apply_policy, worker_id())
        self.router = Router(
            rc, {s.name: s.triton_model for s in config.local_models()}, charged=pool.charges
        )
        pool.cost_aware = lambda: self.router.cost_aware  # cheapest remote first under routing: cost
        self.triton_circuit = CircuitBreaker(
            "triton", failures=rc.triton_circuit_failures, reset_after_s=rc.triton_circuit_reset_s
        )
        self.remote_circuit = CircuitBreaker(
            "remote",
            failures=self.remote_config.circuit_failures,
            reset_after_s=self.remote_config.circuit_reset_s,
        )
        self.cache = ResultCache(redis, keys, cc.ttl_s) if cc.enabled else None
        self.streams = StreamedChat(redis, keys, config.limits)  # streamed chat jobs (workers/streaming/chat.py)
        self._peak_rate: dict[str, float] = {}  # model → fastest local items/s seen lately
        # (kind, model) → monotonic time until which the remote is taken not to serve it.
        self._lacking: dict[tuple[str, str], float] = {}
        self.load = LocalLoad()
        self._routes: dict[tuple[Route, str], Any] = {}
        self.sampler = Sampler(
            redis=redis,
            keys=keys,
            lanes=config.lanes,
            backlog=local.backlog,
            triton_ready=triton.ready,
            metrics_url=config.triton_metrics_url,
            load=self.load,
            models=[s.name for s in config.local_models()],
            publish=self._observe,
            interval_s=rc.sample_interval_s,
        )

    def start(self) -> None:
        self.sampler.start()
        self.ledger.start()
        self.budgets.start()
        self.policy.start()

    def _apply_policy(self, router: RouterConfig, policy: RoutingPolicy) -> None:
        self.router.reconfigure(router)
        self._backends = dict(policy.models)

    def _count_route(self, route: Route, reason: str) -> None:
        # The labelled child is looked up once per (route, reason), not once per job.
        counter = self._routes.get((route, reason))
        if counter is None:
            counter = self._routes[(route, reason)] = ROUTES.labels(route.value, reason)
        counter.inc()

    async def aclose(self) -> None:
        await self.sampler.aclose()
        await self.budgets.aclose()
        await self.policy.aclose()
        await self.ledger.aclose()
        if self.remote is not None:
            await self.remote.aclose()

    def _observe(self, snap: Snapshot) -> None:
        self.router.observe(snap)
        self.triton_circuit.probe(snap.triton_ready)
        # The fastest local rate seen lately, per model, for shedding by deadline: kept per sample,
        # so how fast it fades does not depend on how many jobs ask.
        for model in {*snap.local_rate, *self._peak_rate}:
            rate = snap.local_rate.get(model) or 0.0
            self._peak_rate[model] = max(rate, self._peak_rate.get(model, 0.0) * PEAK_DECAY)

    # ------------------------------------------------------------------ jobs

    async def run(self, item: WorkItem) -> Dispatched:
        """Dispatch one job; raises its error."""
        (outcome,) = await self.run_many([item])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def run_many(
        self, items: list[WorkItem], out: list[Any] | None = None
    ) -> list[Dispatched | Exception]:
        """Dispatch a package's jobs: each is routed on its own, local ones run together.

        The route is decided per job (cache, ``local_only``, deadline, load); jobs that stay
        local meet in one batcher submission per model, so a package costs a few coroutines,
        not one per job. Per job: its result, or the exception it failed with. ``out``, a list
        of ``len(items)`` Nones, receives each outcome as soon as it is known (a caller may
        watch its assignments to write results as they come back).
        """
        self.start()
        if out is None:
            out = [None] * len(items)
        plans: list[tuple[int, WorkItem, Any, ModelSpec]] = []
        for i, item in enumerate(items):
            try:
                request, spec = self.local.resolve(item)
            except ItemError as exc:
                out[i] = failed_at(exc, Route.local)  # refused here, before any backend
                continue
            plans.append((i, item, request, spec))
        if self.cache is not None:
            streamed = [p for p in plans if p[1].stream]  # tokens must reach the stream: no cache
            plans = await self._from_cache([p for p in plans if not p[1].stream], out) + streamed
        local: dict[str, list[_Plan]] = {}
        remote_embeds: dict[tuple[str, int | None], list[_Plan]] = {}
        calls = []
        now = time.time()
        for i, item, request, spec in plans:
            if spec.remote_only and (item.local_only or item.route == "local"):
                out[i] = failed_at(InvalidRequest(_REMOTE_ONLY_LOCAL.format(spec.name)), Route.local)
                continue
            if spec.remote_only and self.budgets.exceeded(item.tenant):
                out[i] = failed_at(BudgetExceeded(self._over_budget(item.tenant, spec)), Route.remote)
                continue
            route, reason = self._decide(item, spec)
            if route == Route.local and (shed := self._shed(item, spec, now)) is not None:
                out[i] = shed
            elif item.stream and isinstance(request, ChatRequest):
                calls.append(self._streamed(i, item, request, spec, route, reason, out))
            elif route == Route.local:
                local.setdefault(spec.name, []).append((i, item, request, spec, reason))
            elif isinstance(request, EmbeddingRequest):  # spilled embeddings travel together
                remote_embeds.setdefault((spec.name, request.dimensions), []).append(
                    (i, item, request, spec, reason)
                )
            else:
                calls.append(self._one(i, item, request, spec, route, reason, out))
        for group in local.values():
            calls += [self._local_group(chunk, out) for chunk in self._local_chunks(group)]
        for group in remote_embeds.values():
            calls += [self._remote_group(chunk, out) for chunk in self._remote_chunks(group)]
        await asyncio.gather(*calls)
        return [o if o is not None else BackendUnavailable("not dispatched") for o in out]

    async def _from_cache(
        self, plans: list[tuple[int, WorkItem, Any, ModelSpec]], out: list[Dispatched | Exception | None]
    ) -> list[tuple[int, WorkItem, Any, ModelSpec]]:
        assert self.cache is not None
        hits = await asyncio.gather(*(self.cache.get(item) for _, item, _, _ in plans))
        misses = []
        for plan, hit in zip(plans, hits, strict=True):
            if hit is None:
                misses.append(plan)
            else:
                self._count_route(Route.cache, "cache")
                self.ledger.record(plan[1], plan[3], hit, Route.cache)
                out[plan[0]] = Dispatched(hit, Route.cache, "cache")
        return misses

    async def _settle(
        self,
        i: int,
        item: WorkItem,
        spec: ModelSpec,
        answer: Answer,
        route: Route,
        reason: str,
        out: list[Any],
    ) -> None:
        self._count_route(route, reason)
        self.ledger.record(item, spec, answer, route, reason)
        if self.cache is not None:
            await self.cache.put(item, answer)
        out[i] = Dispatched(answer, route, reason)

    async def _streamed(
        self,
        i: int,
        item: WorkItem,
        request: ChatRequest,
        spec: ModelSpec,
        route: Route,
        reason: str,
        out: list[Any],
    ) -> None:
        """A streamed chat job: its tokens go to its stream as they come (workers/streaming/chat.py)."""
        sources = stream_sources(self, item, spec, route, reason)
        try:
            answer, source = await self.streams.run(item, request, sources)
        except Exception as exc:
            out[i] = failed_at(exc, route)
            return
        await self._settle(i, item, spec, answer, source.route, source.reason, out)

    async def _one(
        self, i: int, item: WorkItem, request: Any, spec: ModelSpec, route: Route, reason: str, out: list[Any]
    ) -> None:
        try:
            answer, route, reason = await self._execute(item, request, spec, route, reason)
        except Exception as exc:
            out[i] = exc
            return
        await self._settle(i, item, spec, answer, route, reason, out)

    async def _local_group(self, group: list[_Plan], out: list[Any]) -> None:
        """Jobs of one model that stay local: one batcher submission; failover job by job."""
        spec = group[0][3]
        lane = group[0][1].lane
        token = self.load.begin(spec.name, sum(batch_items(g[2]) for g in group), lane)
        answers: list[Answer | Exception]
        try:
            answers = list(
                await self.local.run_many([(item, request) for _, item, request, _, _ in group], spec)
            )
        except Exception as exc:  # the group failed as a whole (a bug in a handler): each job fails
            log.exception("local group failed", model=spec.name, jobs=len(group))
            answers = [exc] * len(group)
        for answer in answers:
            if isinstance(answer, Exception):
                failed_at(answer, Route.local)
        unavailable = sum(isinstance(a, BackendUnavailable) for a in answers)
        self.load.end(spec.name, token, done=unavailable < len(answers))
        if unavailable:
            self.triton_circuit.record_failure()
        if unavailable < len(answers):
            self.triton_circuit.record_success()
        retry = []
        for (i, item, request, _, reason), answer in zip(group, answers, strict=True):
            if isinstance(answer, BackendUnavailable):
                if self._may_fail_over(item, spec):
                    log.warning("Triton unavailable; the job fails over to the remote", job_id=item.id)
                    retry.append(self._remote_failover(i, item, request, spec, out))
                else:
                    out[i] = answer
            elif isinstance(answer, Exception):
                out[i] = answer
            else:
                await self._settle(i, item, spec, answer, Route.local, reason, out)
        if retry:
            await asyncio.gather(*retry)

    def _remote_chunks(self, group: list[_Plan]) -> list[list[_Plan]]:
        """Consecutive chunks of at most the remote's inputs per request."""
        return chunked(group, self.remote_config.max_batch_inputs)

    def _local_chunks(self, group: list[_Plan]) -> list[list[_Plan]]:
        """Consecutive chunks of about one backend batch each: a chunk's results come back (and
        are written) when its batch does, not when the package's last batch does."""
        batcher = self.local.batchers.get(group[0][3].name)
        return chunked(group, batcher.max_batch) if batcher is not None else [group]

    async def _remote_group(self, group: list[_Plan], out: list[Any]) -> None:
        """Embedding jobs routed to the remote: one request; an outage sends each one local."""
        assert self.remote is not None
        spec = group[0][3]
        try:
            answers = await self.remote.embed_many(
                [(item, request) for _, item, request, _, _ in group], spec
            )
        except Exception as exc:  # the combined request failed as a whole: an outage, or a gap
            answers = [exc] * len(group)
        failures = [a for a in answers if isinstance(a, Exception)]
        for exc in {id(e): e for e in failures}.values():  # once per distinct failure, as one call
            self._remote_failed(exc, spec)
        if len(failures) < len(answers):
            self.remote_circuit.record_success()
        fallback = []
        for (i, item, request, _, reason), answer in zip(group, answers, strict=True):
            if isinstance(answer, RemoteUnavailable) and spec.remote_only:
                out[i] = answer  # no local model: the job waits for a remote
            elif isinstance(answer, RemoteUnavailable):
                log.warning("remote failed; the job runs locally", job_id=item.id, error=answer.message)
                fallback.append(self._one(i, item, request, spec, Route.local, "failover", out))
            elif isinstance(answer, Exception):
                out[i] = failed_at(answer, Route.remote)
            else:
                await self._settle(i, item, spec, answer, Route.remote, reason, out)
        if fallback:
            await asyncio.gather(*fallback)

    def _remote_failed(self, exc: Exception, spec: ModelSpec) -> None:
        """Book a failed remote call: a missing endpoint marks the gap, an outage the circuit."""
        if isinstance(exc, RemoteLacks):
            self._lacking[(spec.kind.value, spec.name)] = (
                time.monotonic() + self.remote_config.unsupported_recheck_s
            )
            log.warning("remote does not serve this; its jobs stay local", model=spec.name, error=exc.message)
        elif isinstance(exc, RemoteUnavailable):
            self.remote_circuit.record_failure()
        failed_at(exc, Route.remote)

    async def _remote_failover(
        self, i: int, item: WorkItem, request: Any, spec: ModelSpec, out: list[Any]
    ) -> None:
        try:
            answer = await self._remote(item, request, spec)
        except Exception as exc:
            out[i] = exc
            return
        await self._settle(i, item, spec, answer, Route.remote, "failover", out)

    def _shed(self, item: WorkItem, spec: ModelSpec, now: float) -> DeadlineShed | None:
        """A job the local work ahead would take past its deadline expires now, not later."""
        left = item.deadline_at - now
        if left > SHED_HORIZON_S:
            return None  # far from its deadline: no estimate is needed
        # The fastest rate seen lately, not the current one: at the start of a burst the current
        # rate is still low, and a wait estimated from it would shed jobs that can make it.
        peak = self._peak_rate.get(spec.name, 0.0)
        if peak <= 0:
            return None  # no measure of capacity yet: run it
        wait = self.load.ahead_of(spec.name, item.lane) / peak
        if wait <= left + SHED_MARGIN_S:
            return None
        message = (
            f"about {wait:.1f} s of work was ahead of it on its backend, {max(left, 0):.1f} s to its deadline"
        )
        return failed_at(
            DeadlineShed(f"the job could not finish before its deadline: {message}"), Route.local
        )

    def _eligible(self, item: WorkItem, spec: ModelSpec) -> bool:
        return (
            self.remote is not None
            and not item.local_only
            and self.remote.serves(spec)
            and not self._remote_lacks(spec)
        )

    def _over_budget(self, tenant: str, spec: ModelSpec) -> str:
        return (
            f"tenant {tenant!r} has spent ${self.budgets.spent(tenant):.4f} on remotes this month, "
            f"its budget is ${self.budgets.budget(tenant):.4f}; model {spec.name!r} runs only on a remote"
        )

    def _remote_lacks(self, spec: ModelSpec) -> bool:
        until = self._lacking.get((spec.kind.value, spec.name))
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._lacking[(spec.kind.value, spec.name)]  # time to probe again: the next job tries
        return False

    def _decide(self, item: WorkItem, spec: ModelSpec) -> tuple[Route, str]:
        if spec.remote_only:
            return Route.remote, "remote_only"  # no local model: the policy has nothing to weigh
        eligible = self._eligible(item, spec)
        if eligible and self.budgets.exceeded(item.tenant):
            return Route.local, "budget_exceeded"  # it waits for local capacity instead
        backend = self._backends.get(spec.name)  # the live policy's model → backend map
        if backend == "local" and item.route != "remote":
            return Route.local, "policy"
        if backend == "remote" and eligible and item.route != "local" and self.remote_circuit.allow():
            return Route.remote, "policy"
        job = JobView(
            model=spec.name,
            lane=item.lane,
            route=item.route,
            local_only=item.local_only,
            seconds_left=item.deadline_at - time.time(),
            eligible=eligible,
        )
        if item.local_only or item.route == "local" or not eligible:
            # The job cannot leave: the policy's answer depends on nothing sampled.
            return self.router.decide(job, _HEALTHY, 0.0)
        health = Health(triton_ok=self.triton_circuit.allow(), remote_ok=self.remote_circuit.allow())
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
                if spec.remote_only:
                    raise  # nothing local to fall back to: the job waits for a remote
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
        if self.budgets.exceeded(item.tenant):
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
        except BackendUnavailable as exc:
            self.triton_circuit.record_failure()
            failed_at(exc, Route.local)
            raise
        except Exception as exc:
            failed_at(exc, Route.local)
            raise
        finally:
            self.load.end(spec.name, token, done=done)
        self.triton_circuit.record_success()
        return answer

    async def _remote(self, item: WorkItem, request: Any, spec: ModelSpec) -> Answer:
        assert self.remote is not None
        try:
            answer = await self.remote.run(item, request, spec)
        except Exception as exc:
            # A gap in what the remote offers (RemoteLacks) is not an outage: the circuit stays.
            self._remote_failed(exc, spec)
            raise
        self.remote_circuit.record_success()
        return answer
