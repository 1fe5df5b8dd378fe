"""The remote's settings, and its API key: from env or a mounted secret file, re-read on rotation.

The key is redacted from every message that leaves the remote backend (:func:`redact`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import REMOTE_DEFAULT, JobKind, Offers, get_logger

from ...core.settings import ModelSpec
from ...core.watched import WatchedFile

log = get_logger(__name__)

FORWARD_FIELDS: dict[JobKind, set[str]] = {
    JobKind.embed: {"input", "dimensions"},
    JobKind.chat: {"messages", "max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
                   "frequency_penalty", "tools", "tool_choice", "parallel_tool_calls", "response_format",
                   "logprobs", "top_logprobs"},
    JobKind.rerank: {"query", "documents", "top_n"},
}  # fmt: skip


class RemoteConfig(BaseSettings):
    """The remote API: where it is, which of our models it serves, and how hard to try it."""

    model_config = SettingsConfigDict(env_prefix="OVERSPILL_REMOTE_", extra="forbid")

    base_url: str = ""  # e.g. https://api.openai.com/v1; empty: no remote
    api_key: SecretStr | None = None
    api_key_file: Path | None = None  # a mounted secret; wins over api_key
    # Local model name → the remote's name for it. Unmapped models keep their name.
    model_map: dict[str, str] = Field(default_factory=dict)
    # Local models the remote serves identically. Embeddings spill only to these: vectors
    # of two different models must never meet in one index.
    same_models: set[str] = Field(default_factory=set)
    max_concurrency: int = Field(default=32, ge=1)
    max_connections: int = Field(default=64, ge=1)
    timeout_s: float = Field(default=30.0, gt=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    backoff_s: float = Field(default=0.2, ge=0)
    backoff_max_s: float = Field(default=5.0, ge=0)
    retry_after_max_s: float = Field(default=10.0, ge=0)
    circuit_failures: int = Field(default=3, ge=1)
    circuit_reset_s: float = Field(default=5.0, ge=0)
    # Job kinds the remote serves. OpenAI has no rerank endpoint: rerank spills only when listed.
    kinds: set[JobKind] = Field(default_factory=lambda: {JobKind.chat, JobKind.embed})
    # Request fields forwarded to the remote, per kind; anything else a tenant sent (store,
    # service_tier, metadata, user, logprobs, ...) stays here: it could cost money or leak data.
    forward_fields: dict[JobKind, set[str]] = Field(default_factory=lambda: dict(FORWARD_FIELDS))
    # After the remote said it lacks an endpoint or model, jobs of it stay local this long;
    # the first job after that is the probe that finds out whether it is served now.
    unsupported_recheck_s: float = Field(default=300.0, ge=0)
    # Embedding jobs that spill together go as one request of at most this many inputs.
    max_batch_inputs: int = Field(default=2048, ge=1)
    # A 200 chat answer with no content (and no refusal) although max_tokens >= 1 is a remote
    # fault: retried elsewhere like a 5xx. False: passed on as the remote's answer. Counted and
    # logged either way (overspill_remote_empty_replies_total).
    empty_reply_is_fault: bool = True
    # What its chat models offer beyond text: all of tools, response_format and logprobs, and no
    # known context limit, as OpenAI's API; narrow it for a server that lacks some
    # (OVERSPILL_REMOTE_OFFERS='{"features": ["tools"], "context_tokens": 8192}').
    offers: Offers = Field(default_factory=lambda: REMOTE_DEFAULT.model_copy(deep=True))

    @property
    def enabled(self) -> bool:
        return bool(self.base_url)

    def remote_model(self, local_name: str) -> str:
        return self.model_map.get(local_name, local_name)

    def serves(self, spec: ModelSpec) -> bool:
        """May jobs for this local model go to the remote at all?"""
        if not self.enabled or spec.kind not in self.kinds:
            return False
        if spec.kind == JobKind.embed:
            return spec.name in self.same_models
        return True


class ApiKey:
    """The current API key: from the secret file when one is set (re-read on change), else env."""

    def __init__(self, config: RemoteConfig) -> None:
        self._env = config.api_key.get_secret_value() if config.api_key else ""
        self._value = self._env
        path = config.api_key_file
        # Read on every request: a rotated key is used by the next one (a stat-sized cost).
        self._file = WatchedFile(path, _read_key, "remote_api_key", interval_s=0.0) if path else None

    def get(self) -> str:
        if self._file is None:
            return self._env
        key = self._file.poll()
        if key is not None:
            self._value = key  # a secret being swapped in place keeps the last good key
        return self._value


def _read_key(path: Path) -> str:
    return path.read_text().strip()


def redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text
