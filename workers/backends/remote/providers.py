"""Several remotes, tried in order: the providers file, and the pool that routes to them.

The providers file (``OVERSPILL_PROVIDERS_FILE``, YAML or JSON) lists the remotes in their order
of fallback, each with its base URL, key file, the catalogue models it serves (and its own name
for each), its limits (shared by every worker, :mod:`workers.backends.remote.ratelimit`) and its prices::

    remotes:
      - name: primary
        base_url: https://api.example.com/v1
        api_key_file: /run/secrets/primary_key
        models: {gpt-4.1-mini: gpt-4.1-mini, SmolLM2-135M-Instruct: gpt-4.1-nano}
        limits: {requests_per_min: 500, tokens_per_min: 200000, concurrency: 16}
        prices: {gpt-4.1-mini: {input_per_1m: 0.4, output_per_1m: 1.6}}
      - name: backup
        base_url: https://backup.example.com/v1
        models: {gpt-4.1-mini: openai/gpt-4.1-mini}
    local: {replica_per_hour: 1.2}

Without a file, the ``OVERSPILL_REMOTE_*`` variables describe the one remote (named ``remote``).
A file that does not parse stops the worker at start with the file's name and the reason.
Its prices (``remotes[].prices`` and ``local``) are re-read when the file changes
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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import EmbeddingRequest, JobKind, WorkItem, first_error, get_logger, parse_text

from ...core.circuit import CircuitBreaker
from ...core.errors import RemoteLacks, RemoteUnavailable
from ...core.metrics import PROVIDER_CALLS
from ...core.settings import ModelSpec, WorkerConfig
from ...core.watched import WatchedFile
from ..base import Answer
from .client import RemoteBackend
from .config import RemoteConfig
from .handlers import RemoteHandlers
from .ratelimit import ProviderLimits, SharedLimiter

log = get_logger(__name__)

PRICES_REFRESH_S = 1.0  # how often the providers file is checked for new prices
ENV_PROVIDER = "remote"  # the name of the one remote the OVERSPILL_REMOTE_* variables describe


class ProvidersFileError(ValueError):
    """The providers file is missing, does not parse, or does not validate."""


class Price(BaseModel):
    """A remote model's price, in dollars per million tokens."""

    model_config = ConfigDict(extra="forbid")

    input_per_1m: float = Field(default=0.0, ge=0)
    output_per_1m: float = Field(default=0.0, ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_1m + completion_tokens * self.output_per_1m) / 1e6

    @property
    def per_1m(self) -> float:
        """What ranks remotes by price: a million tokens in and a million out."""
        return self.input_per_1m + self.output_per_1m


class LocalPrice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replica_per_hour: float = Field(default=0.0, ge=0)  # what one Triton replica costs an hour


class ProviderSpec(BaseModel):
    """One remote in the providers file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    base_url: str = Field(min_length=1)
    api_key_file: Path | None = None
    # Catalogue model → the remote's name for it ("" keeps ours). Only these go to this remote.
    models: dict[str, str] = Field(default_factory=dict)
    same_models: set[str] = Field(default_factory=set)  # local embedding models it serves identically
    kinds: set[JobKind] = Field(default_factory=lambda: {JobKind.chat, JobKind.embed, JobKind.rerank})
    limits: ProviderLimits = Field(default_factory=ProviderLimits)
    prices: dict[str, Price] = Field(default_factory=dict)  # by catalogue model name
    timeout_s: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    retry_after_max_s: float = Field(default=10.0, ge=0)
    max_concurrency: int = Field(default=32, ge=1)  # this worker's requests in flight to it
    empty_reply_is_fault: bool = True  # an empty chat answer fails over (RemoteConfig's doc)

    def remote_config(self) -> RemoteConfig:
        """The remote's settings, from this entry alone (not from the environment)."""
        model_map = {local: remote for local, remote in self.models.items() if remote}
        return RemoteConfig.model_construct(
            base_url=self.base_url,
            api_key_file=self.api_key_file,
            model_map=model_map,
            same_models=self.same_models,
            kinds=self.kinds,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            retry_after_max_s=self.retry_after_max_s,
            max_concurrency=self.max_concurrency,
            empty_reply_is_fault=self.empty_reply_is_fault,
        )


class ProvidersFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    remotes: list[ProviderSpec] = Field(default_factory=list)  # in their order of fallback
    local: LocalPrice = Field(default_factory=LocalPrice)

    @field_validator("remotes")
    @classmethod
    def _unique(cls, remotes: list[ProviderSpec]) -> list[ProviderSpec]:
        names = [r.name for r in remotes]
        if len(set(names)) != len(names):
            raise ValueError(f"remote names must be unique: {names}")
        return remotes


class ProvidersConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="forbid")

    providers_file: Path | None = None


def parse_document(path: Path) -> Any:
    """A YAML or JSON document (JSON is YAML, but its errors read better from ``json``)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProvidersFileError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        return parse_text(text, str(path), as_json=path.suffix == ".json")
    except ValueError as exc:
        raise ProvidersFileError(str(exc)) from None


def load_providers(path: Path) -> ProvidersFile:
    data = parse_document(path)
    try:
        return ProvidersFile.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise ProvidersFileError(f"{path}: {first_error(exc)}") from None


def env_provider(remote: RemoteConfig) -> ProviderSpec | None:
    """The ``OVERSPILL_REMOTE_*`` remote as a providers-file entry, or None without one."""
    if not remote.enabled:
        return None
    return ProviderSpec(name=ENV_PROVIDER, base_url=remote.base_url, kinds=set(remote.kinds))


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

    def serves(self, spec: ModelSpec) -> bool:
        return any(p.serves(spec) for p in self.providers)

    def candidates(self, spec: ModelSpec) -> list[Provider]:
        ready = [p for p in self.providers if p.serves(spec) and p.ready(spec)]
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
        return await self._first(spec, lambda p: p.handlers.run(item, request, spec), item.id)

    async def embed_many(
        self, jobs: Sequence[tuple[WorkItem, EmbeddingRequest]], spec: ModelSpec
    ) -> list[Answer | Exception]:
        """Embedding jobs as one request, on the first remote that takes them all."""
        answers: list[Answer | Exception] = await self._first(
            spec, lambda p: p.handlers.embed_many(jobs, spec), jobs[0][0].id
        )
        return answers

    async def _first(self, spec: ModelSpec, call: Any, job_id: str) -> Any:
        last: RemoteUnavailable | None = None
        tried = lacking = 0
        for provider in self.candidates(spec):
            tried += 1
            try:
                result = await call(provider)
            except RemoteLacks as exc:
                provider.lacks(spec)
                last = exc
                lacking += 1
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
        if lacking == tried or tried == 1:  # one remote, or all lack the model (a gap, not an outage)
            raise last
        raise RemoteUnavailable(f"every remote failed for model {spec.name!r}; the last: {last.message}")
