"""Several remotes, tried in order: the providers file, and the pool that routes to them.

The file's format is :mod:`workers.backends.remote.providers_file`. Its prices (``remotes[].prices`` and ``local``) are re-read when the file changes
(:class:`workers.core.watched.WatchedFile`); a version that does not parse or validate, a negative
price say, keeps the prices in force. Other changes take effect at the next start.

:class:`RemotePool` runs a job on the first remote that serves its model and whose circuit is
closed; an outage of one (after its own retries) moves the job to the next. Only when every
remote has failed does the job see :class:`RemoteUnavailable`. With cost-aware routing on,
the remotes that serve a model are tried cheapest first (by their price per million input plus
output tokens; a remote without a price for the model comes after those with one, in file
order), so the fallback order only breaks ties.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from producer.contract import EmbeddingRequest, JobKind, Offers, WorkItem, get_logger, lacking

from ...core.circuit import CircuitBreaker
from ...core.errors import RemoteLacks, RemoteUnavailable
from ...core.metrics import PROVIDER_CALLS
from ...core.settings import ModelSpec, WorkerConfig
from ...core.watched import WatchedFile
from ..base import Answer
from .client import RemoteBackend
from .config import RemoteConfig
from .handlers import RemoteHandlers
from .providers_file import LocalPrice, Price, ProvidersFile, ProviderSpec, env_provider, load_providers
from .ratelimit import SharedLimiter

log = get_logger(__name__)

PRICES_REFRESH_S = 1.0  # how often the providers file is checked for new prices


@dataclass
class Provider:
    spec: ProviderSpec
    config: RemoteConfig
    handlers: RemoteHandlers
    circuit: CircuitBreaker
    limiter: SharedLimiter | None
    listed: bool  # serves only its listed models (from the file), not every model of its kinds
    _lacking: dict[str, float] = field(default_factory=dict)  # model → until when it lacks it

    @property
    def name(self) -> str:
        return self.spec.name

    def serves(self, spec: ModelSpec) -> bool:
        if spec.kind not in self.config.kinds:
            return False
        if self.listed and spec.name not in self.spec.models:
            return False
        if spec.remote_only:
            return True  # no local vectors to stay consistent with
        if spec.kind == JobKind.embed:
            return spec.name in self.config.same_models
        return True

    def offers(self, item: WorkItem | None) -> bool:
        """Whether this remote offers what the chat job needs (tools, logprobs, context, ...)."""
        return item is None or item.kind != JobKind.chat or not lacking(item.body, self.config.offers)

    def ready(self, spec: ModelSpec) -> bool:
        until = self._lacking.get(spec.name)
        if until is not None and time.monotonic() >= until:
            del self._lacking[spec.name]
            until = None
        return until is None and self.circuit.allow()

    def lacks(self, spec: ModelSpec) -> None:
        self._lacking[spec.name] = time.monotonic() + self.config.unsupported_recheck_s


class RemotePool:
    """The remotes in their order of fallback, each with its own circuit and shared limits."""

    def __init__(
        self,
        providers: list[Provider],
        local_price: LocalPrice | None = None,
        prices_file: WatchedFile[ProvidersFile] | None = None,
    ) -> None:
        self.providers = providers
        self.local_price = local_price or LocalPrice()
        self._prices_file = prices_file
        # Set by the dispatcher to the routing policy in force: cheapest remote first when True.
        self.cost_aware: Callable[[], bool] = lambda: False

    @classmethod
    def build(
        cls,
        config: WorkerConfig,
        redis: Any,
        remote: RemoteConfig,
        file: ProvidersFile | None,
        path: Path | None = None,
    ) -> RemotePool:
        """The pool of ``file``'s remotes (or the one of ``OVERSPILL_REMOTE_*``); ``path`` is
        where ``file`` was read from, re-read for its prices."""
        root = f"{config.prefix}:v1"
        specs: list[tuple[ProviderSpec, RemoteConfig, bool]] = []
        if file is not None:
            specs = [(s, s.remote_config(), True) for s in file.remotes]
        elif (one := env_provider(remote)) is not None:
            specs = [(one, remote, False)]
        providers = []
        for spec, rc, listed in specs:
            limiter = SharedLimiter(redis, root, spec.name, spec.limits) if spec.limits.limited else None
            backend = RemoteBackend(rc, limiter=limiter)
            providers.append(
                Provider(
                    spec,
                    rc,
                    RemoteHandlers(config, rc, backend),
                    CircuitBreaker(
                        f"remote:{spec.name}",
                        failures=remote.circuit_failures,
                        reset_after_s=remote.circuit_reset_s,
                    ),
                    limiter,
                    listed,
                )
            )
        watched = None
        if file is not None and path is not None:
            watched = WatchedFile(path, load_providers, "prices", interval_s=PRICES_REFRESH_S)
            watched.prime()
        return cls(providers, file.local.model_copy() if file is not None else None, watched)

    def refresh_prices(self) -> bool:
        """Take the providers file's new prices if it changed (at most one stat a second)."""
        if self._prices_file is None or (file := self._prices_file.poll()) is None:
            return False
        by_name = {spec.name: spec for spec in file.remotes}
        for p in self.providers:
            new = by_name.get(p.name)
            if new is not None:
                p.spec = p.spec.model_copy(update={"prices": new.prices})
            if new is None or new.model_dump(exclude={"prices"}) != p.spec.model_dump(exclude={"prices"}):
                log.warning("providers file changed beyond prices; that takes a restart", provider=p.name)
        # In place: the ledger holds this object.
        self.local_price.replica_per_hour = file.local.replica_per_hour
        log.info("prices re-read", providers=[p.name for p in self.providers])
        return True

    @property
    def enabled(self) -> bool:
        return bool(self.providers)

    def serves(self, spec: ModelSpec, item: WorkItem | None = None) -> bool:
        """Whether some remote serves the model (and offers what ``item`` needs)."""
        return any(p.serves(spec) and p.offers(item) for p in self.providers)

    def offers(self, spec: ModelSpec) -> Offers | None:
        """What the remotes serving ``spec`` offer between them (None: no remote serves it)."""
        offers = [p.config.offers for p in self.providers if p.serves(spec)]
        if not offers:
            return None
        union = offers[0]
        for more in offers[1:]:
            union = union.union(more)
        return union

    def candidates(self, spec: ModelSpec, item: WorkItem | None = None) -> list[Provider]:
        """The remotes that may take a job of ``spec`` now, in order; only those offering what
        ``item`` needs, when given."""
        ready = [p for p in self.providers if p.serves(spec) and p.offers(item) and p.ready(spec)]
        return self._ordered(ready, spec.name)

    def _ordered(self, providers: list[Provider], model: str) -> list[Provider]:
        """Fallback order; cheapest first when cost-aware (a stable sort: the order breaks ties)."""
        self.refresh_prices()
        if not self.cost_aware():
            return providers

        def rank(p: Provider) -> tuple[int, float]:
            price = p.spec.prices.get(model)
            return (1, 0.0) if price is None else (0, price.per_1m)

        return sorted(providers, key=rank)

    def price(self, provider: str | None, model: str) -> Price | None:
        """A remote's price for a model; with ``provider`` None, the price of the remote a
        spilled job would go to first (the first that prices it; the cheapest when cost-aware)."""
        if provider is None:
            priced = [p for p in self._ordered(self.providers, model) if model in p.spec.prices]
            return priced[0].spec.prices[model] if priced else None
        self.refresh_prices()
        for p in self.providers:
            if p.name == provider:
                return p.spec.prices.get(model)
        return None

    def charges(self, model: str) -> bool:
        """Whether the remote a spilled job of ``model`` would go to charges for it."""
        price = self.price(None, model)
        return price is not None and price.per_1m > 0

    async def aclose(self) -> None:
        for p in self.providers:
            await p.handlers.aclose()

    async def run(self, item: WorkItem, request: Any, spec: ModelSpec) -> Answer:
        """Run one job on the first remote that takes it; the next one when it is down."""
        return await self._first(spec, lambda p: p.handlers.run(item, request, spec), item.id, item)

    async def embed_many(
        self, jobs: Sequence[tuple[WorkItem, EmbeddingRequest]], spec: ModelSpec
    ) -> list[Answer | Exception]:
        """Embedding jobs as one request, on the first remote that takes them all."""
        answers: list[Answer | Exception] = await self._first(
            spec, lambda p: p.handlers.embed_many(jobs, spec), jobs[0][0].id
        )
        return answers

    async def _first(self, spec: ModelSpec, call: Any, job_id: str, item: WorkItem | None = None) -> Any:
        last: RemoteUnavailable | None = None
        tried = gaps = 0
        for provider in self.candidates(spec, item):
            tried += 1
            try:
                result = await call(provider)
            except RemoteLacks as exc:
                provider.lacks(spec)
                last = exc
                gaps += 1
                PROVIDER_CALLS.labels(provider.name, "lacks").inc()
                log.warning(
                    "remote does not serve the model; next remote", provider=provider.name, job_id=job_id
                )
                continue
            except RemoteUnavailable as exc:
                provider.circuit.record_failure()
                last = exc
                PROVIDER_CALLS.labels(provider.name, "unavailable").inc()
                log.warning(
                    "remote unavailable; next remote",
                    provider=provider.name,
                    job_id=job_id,
                    error=exc.message,
                )
                continue
            provider.circuit.record_success()
            PROVIDER_CALLS.labels(provider.name, "ok").inc()
            for answer in result if isinstance(result, list) else [result]:
                if isinstance(answer, Answer):
                    answer.extra["provider"] = provider.name
            return result
        if last is None:
            raise RemoteUnavailable(f"no remote is available for model {spec.name!r}")
        if gaps == tried or tried == 1:  # one remote, or all lack the model (a gap, not an outage)
            raise last
        raise RemoteUnavailable(f"every remote failed for model {spec.name!r}; the last: {last.message}")
