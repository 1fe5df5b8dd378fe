"""Dispatch one job: result cache → router → local Triton or the remote, with failover.

Failover runs both ways within the job: Triton unavailable → the remote, if the job may go
there; the remote failing past its retries → local. Each backend has a circuit breaker, so
once one is known to be down, later jobs skip it instead of each discovering it. A job that
can reach neither raises :class:`BackendUnavailable` and the package re-queues it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from producer.contract import ChatRequest, EmbeddingRequest, Keys, Route, RouteReason, WorkItem, get_logger

from ..accounting.budgets import Budgets
from ..accounting.ledger import Ledger
from ..backends.base import Answer
from ..backends.local.handlers import LocalHandlers
from ..backends.local.triton import TritonBackend
from ..backends.remote.providers import RemotePool
from ..backends.remote.providers_file import ProvidersFile, load_providers
from ..core.errors import BackendUnavailable, BudgetExceeded, InvalidRequest, ItemError, RemoteUnavailable
from ..core.metrics import ROUTES
from ..core.settings import ModelSpec, WorkerConfig
from ..routing.policy import PolicyWatcher, worker_id
from ..routing.router import Router
from ..routing.signals import Sampler
from ..streaming.chat import StreamedChat
from .cache import ResultCache
from .decide import Decider
from .plan import Dispatched, Plan, batch_items, chunked, failed_at
from .settings import DispatchSettings
from .sources import stream_sources

log = get_logger(__name__)

_REMOTE_ONLY_LOCAL = "model {!r} is served only by a remote; local_only or route 'local' cannot run it"


class Dispatcher:
    def __init__(
        self,
        config: WorkerConfig,
        redis: Any,
        local: LocalHandlers,
        triton: TritonBackend,
        settings: DispatchSettings | None = None,
        *,
        providers: ProvidersFile | None = None,
    ) -> None:
        s = settings or DispatchSettings()
        rc, cc = s.router, s.cache
        self.remote_config = s.remote
        keys = Keys(config.prefix)
        self.local = local
        path = s.providers.providers_file
        if providers is None and path is not None:
            providers = load_providers(path)  # a bad file stops the worker here, with its reason
        pool = RemotePool.build(config, redis, self.remote_config, providers, path)
        self.remote: RemotePool | None = pool if pool.enabled else None
        self.config = config
        self.ledger = Ledger(redis, keys, pool.price, pool.local_price)
        self.budgets = Budgets(redis, keys, self.ledger, s.budgets)
        router = Router(rc, {s.name: s.triton_model for s in config.local_models()}, charged=pool.charges)
        pool.cost_aware = lambda: router.cost_aware  # cheapest remote first under routing: cost
        self.decider = Decider(rc, self.remote_config, router, self.budgets, self.remote)
        self.router = router
        self.policy = PolicyWatcher(redis, keys, rc, self.decider.apply_policy, worker_id(), s.policy)
        self.cache = ResultCache(redis, keys, cc.ttl_s) if cc.enabled else None
        self.streams = StreamedChat(redis, keys, config.limits)  # streamed chat (streaming/chat.py)
        self.load = self.decider.load
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
            publish=self.decider.observe,
            interval_s=rc.sample_interval_s,
        )

    def start(self) -> None:
        self.sampler.start()
        self.ledger.start()
        self.budgets.start()
        self.policy.start()

    def _count_route(self, route: Route, reason: RouteReason) -> None:
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
        local: dict[str, list[Plan]] = {}
        remote_embeds: dict[tuple[str, int | None], list[Plan]] = {}
        calls = []
        now = time.time()
        for i, item, request, spec in plans:
            if spec.remote_only and (item.local_only or item.route == "local"):
                out[i] = failed_at(InvalidRequest(_REMOTE_ONLY_LOCAL.format(spec.name)), Route.local)
                continue
            if spec.remote_only and self.budgets.exceeded(item.tenant):
                out[i] = failed_at(BudgetExceeded(self.decider.over_budget(item.tenant, spec)), Route.remote)
                continue
            capable = self.decider.by_capability(item, spec)
            if isinstance(capable, Exception):
                out[i] = failed_at(
                    capable, Route.local if isinstance(capable, InvalidRequest) else Route.remote
                )
                continue
            route, reason = (Route.remote, capable) if capable else self.decider.decide(item, spec)
            if route == Route.local and (shed := self.decider.shed(item, spec, now)) is not None:
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
                self._count_route(Route.cache, RouteReason.cache)
                self.ledger.record(plan[1], plan[3], hit, Route.cache)
                out[plan[0]] = Dispatched(hit, Route.cache, RouteReason.cache)
        return misses

    async def _settle(
        self,
        i: int,
        item: WorkItem,
        spec: ModelSpec,
        answer: Answer,
        route: Route,
        reason: RouteReason,
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
        reason: RouteReason,
        out: list[Any],
    ) -> None:
        """A streamed chat job: its tokens go to its stream as they come (workers/streaming/chat.py)."""
        sources = stream_sources(self.decider, self.local.backend, item, spec, route, reason)
        try:
            answer, source = await self.streams.run(item, request, sources)
        except Exception as exc:
            out[i] = failed_at(exc, route)
            return
        await self._settle(i, item, spec, answer, source.route, source.reason, out)

    async def _one(
        self,
        i: int,
        item: WorkItem,
        request: Any,
        spec: ModelSpec,
        route: Route,
        reason: RouteReason,
        out: list[Any],
    ) -> None:
        try:
            answer, route, reason = await self._execute(item, request, spec, route, reason)
        except Exception as exc:
            out[i] = exc
            return
        await self._settle(i, item, spec, answer, route, reason, out)

    async def _local_group(self, group: list[Plan], out: list[Any]) -> None:
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
            self.decider.triton_circuit.record_failure()
        if unavailable < len(answers):
            self.decider.triton_circuit.record_success()
        retry = []
        for (i, item, request, _, reason), answer in zip(group, answers, strict=True):
            if isinstance(answer, BackendUnavailable):
                if self.decider.may_fail_over(item, spec):
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

    def _remote_chunks(self, group: list[Plan]) -> list[list[Plan]]:
        """Consecutive chunks of at most the remote's inputs per request."""
        return chunked(group, self.remote_config.max_batch_inputs)

    def _local_chunks(self, group: list[Plan]) -> list[list[Plan]]:
        """Consecutive chunks of about one backend batch each: a chunk's results come back (and
        are written) when its batch does, not when the package's last batch does."""
        batcher = self.local.batchers.get(group[0][3].name)
        return chunked(group, batcher.max_batch) if batcher is not None else [group]

    async def _remote_group(self, group: list[Plan], out: list[Any]) -> None:
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
            self.decider.remote_failed(exc, spec)
        if len(failures) < len(answers):
            self.decider.remote_circuit.record_success()
        fallback = []
        for (i, item, request, _, reason), answer in zip(group, answers, strict=True):
            if isinstance(answer, RemoteUnavailable) and spec.remote_only:
                out[i] = answer  # no local model: the job waits for a remote
            elif isinstance(answer, RemoteUnavailable):
                log.warning("remote failed; the job runs locally", job_id=item.id, error=answer.message)
                fallback.append(self._one(i, item, request, spec, Route.local, RouteReason.failover, out))
            elif isinstance(answer, Exception):
                out[i] = failed_at(answer, Route.remote)
            else:
                await self._settle(i, item, spec, answer, Route.remote, reason, out)
        if fallback:
            await asyncio.gather(*fallback)

    async def _remote_failover(
        self, i: int, item: WorkItem, request: Any, spec: ModelSpec, out: list[Any]
    ) -> None:
        try:
            answer = await self._remote(item, request, spec)
        except Exception as exc:
            out[i] = exc
            return
        await self._settle(i, item, spec, answer, Route.remote, RouteReason.failover, out)

    async def _execute(
        self, item: WorkItem, request: Any, spec: ModelSpec, route: Route, reason: RouteReason
    ) -> tuple[Answer, Route, str]:
        if route == Route.remote:
            try:
                return await self._remote(item, request, spec), route, reason
            except RemoteUnavailable as exc:
                if spec.remote_only or reason == RouteReason.capability:
                    raise  # nothing local can run it: the job waits for a remote
                log.warning("remote failed; the job runs locally", error=exc.message)
                return await self._local(item, request, spec), Route.local, RouteReason.failover
        try:
            return await self._local(item, request, spec), route, reason
        except BackendUnavailable as exc:
            if not self.decider.may_fail_over(item, spec):
                raise
            log.warning("Triton unavailable; the job fails over to the remote", error=exc.message)
            return await self._remote(item, request, spec), Route.remote, RouteReason.failover

    async def _local(self, item: WorkItem, request: Any, spec: ModelSpec) -> Answer:
        token = self.load.begin(spec.name, batch_items(request), item.lane)
        done = False
        try:
            answer = await self.local.run(item, (request, spec))
            done = True
        except ItemError:
            done = True  # Triton answered: it is up, and the work took its capacity
            self.decider.triton_circuit.record_success()
            raise
        except BackendUnavailable as exc:
            self.decider.triton_circuit.record_failure()
            failed_at(exc, Route.local)
            raise
        except Exception as exc:
            failed_at(exc, Route.local)
            raise
        finally:
            self.load.end(spec.name, token, done=done)
        self.decider.triton_circuit.record_success()
        return answer

    async def _remote(self, item: WorkItem, request: Any, spec: ModelSpec) -> Answer:
        assert self.remote is not None
        try:
            answer = await self.remote.run(item, request, spec)
        except Exception as exc:
            # A gap in what the remote offers (RemoteLacks) is not an outage: the circuit stays.
            self.decider.remote_failed(exc, spec)
            raise
        self.decider.remote_circuit.record_success()
        return answer
