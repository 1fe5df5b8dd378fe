"""The providers file: the remotes in their order of fallback, their offers, limits and prices.

The providers file (``OVERSPILL_PROVIDERS_FILE``, YAML or JSON) lists the remotes in their order
of fallback, each with its base URL, key file, the catalogue models it serves (and its own name
for each), its limits (shared by every worker, :mod:`workers.backends.remote.ratelimit`), its
prices and what its chat models offer beyond text (``offers``, all by default)::

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
        offers: {features: [tools], context_tokens: 8192}
    local: {replica_per_hour: 1.2}

Without a file, the ``OVERSPILL_REMOTE_*`` variables describe the one remote (named ``remote``).
A file that does not parse stops the worker at start with the file's name and the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import REMOTE_DEFAULT, JobKind, Offers, first_error, parse_text

from .config import RemoteConfig
from .ratelimit import ProviderLimits

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
    offers: Offers = Field(default_factory=lambda: REMOTE_DEFAULT.model_copy(deep=True))  # RemoteConfig's doc

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
            offers=self.offers,
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
    return ProviderSpec(
        name=ENV_PROVIDER, base_url=remote.base_url, kinds=set(remote.kinds), offers=remote.offers
    )
