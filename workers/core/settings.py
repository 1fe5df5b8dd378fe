"""Worker configuration: one pydantic-settings class, read from ``OVERSPILL_*`` variables."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import JobKind, Lane, Limits, Offers

from .endpoints import parse_endpoints


class ModelSpec(BaseModel):
    """A model the worker serves: its public name, kind, Triton model, and batching window."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: JobKind
    triton_model: str = ""  # empty only for a remote-only model
    # Served only by the remotes (workers/backends/remote/providers.py): no batcher, never local, never failover.
    remote_only: bool = False
    aliases: list[str] = Field(default_factory=list)
    max_batch: int = Field(default=64, ge=1)  # align with the model's max_batch_size
    dim: int | None = None  # an embedding model's vector size (bounds a result before it runs)
    max_wait_ms: float = Field(default=2.0, ge=0)
    max_inflight: int = Field(default=4, ge=1)  # Triton requests in flight per model
    flush_when_free: bool = True  # no wait while fewer than max_inflight requests are out
    # Token-aware batching (embedding, rerank): a request carries at most this many estimated
    # tokens (rows x its longest row), and each job's inputs go shortest first. None: rows only.
    max_batch_tokens: int | None = Field(default=None, ge=1)
    # ... and a request is the oldest item with those nearest its length among this many waiting.
    batch_lookahead: int = Field(default=0, ge=0)
    # What a chat model serves beyond text, and its context window in tokens: a request
    # needing more goes to a remote that offers it (producer/contract/capabilities.py).
    offers: Offers = Field(default_factory=Offers)

    @model_validator(mode="after")
    def _served_somewhere(self) -> ModelSpec:
        if not self.remote_only and not self.triton_model:
            raise ValueError(f"model {self.name!r} needs a triton_model or remote_only: true")
        return self


DEFAULT_MODELS = [
    ModelSpec(
        name="all-MiniLM-L6-v2",
        kind=JobKind.embed,
        triton_model="embedding",
        aliases=["sentence-transformers/all-MiniLM-L6-v2", "embedding"],
        dim=384,
        max_batch=64,
        max_wait_ms=2.0,
        max_batch_tokens=8192,  # 32 rows of its longest (256 tokens); short rows fill 64
        batch_lookahead=256,
    ),
    # A benchmark model with a fixed cost per execution (stands in for a GPU kernel).
    ModelSpec(
        name="fixed-cost",
        kind=JobKind.embed,
        triton_model="fixed_cost",
        dim=384,
        max_batch=64,
        max_wait_ms=2.0,
    ),
    # Bi-encoder cosine similarity: no cross-encoder ships offline; the name says what it is.
    ModelSpec(
        name="minilm-l6-cosine-rerank",
        kind=JobKind.rerank,
        triton_model="reranker",
        aliases=["reranker", "rerank"],
        max_batch=128,
        max_wait_ms=2.0,
        max_batch_tokens=16384,  # pairs, by their documents' estimated tokens
        batch_lookahead=256,
    ),
    ModelSpec(
        name="SmolLM2-135M-Instruct",
        kind=JobKind.chat,
        triton_model="chat",
        aliases=["HuggingFaceTB/SmolLM2-135M-Instruct", "chat"],
        max_batch=8,
        max_wait_ms=10.0,
        max_inflight=1,
        flush_when_free=False,
        offers=Offers(context_tokens=2048),  # n_ctx in model_repository/chat/config.pbtxt
    ),
]


class WorkerConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="forbid")

    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "overspill"
    triton_url: str = "127.0.0.1:8001"  # gRPC
    # Several replicas: host:port[*weight][/primary|/backup], comma-separated (workers/backends/local/replicas.py);
    # when set it replaces triton_url, which then carries the list.
    triton_urls: str = ""
    triton_metrics_url: str = "http://127.0.0.1:8002/metrics"
    triton_timeout_s: float = 60.0

    lanes: list[Lane] = [Lane.interactive, Lane.bulk]
    max_jobs: int = 256  # concurrent packages on the interactive lane
    bulk_max_jobs: int = 32  # fewer on bulk, so interactive work keeps the batchers' front seats
    # Claim only what the lane finishes in admission_hold_s (workers/queue/admission.py): under a
    # deep backlog the rest stays queued instead of timing out in this worker's batchers.
    admission: bool = True
    admission_floor_items: int = 256  # held at least this many items, whatever the measured rate
    admission_hold_s: float = Field(default=2.0, gt=0)  # seconds of work (at the measured rate) held
    # A claimed package's lease, renewed while it runs: a killed worker's packages run again
    # elsewhere after at most this long.
    package_lease_s: float = Field(default=5.0, ge=1.0)
    # Producers wake the worker when they queue a package; this poll finds deferred packages
    # (retries) and covers a lost wake-up.
    poll_delay_s: float = 0.05
    # arq re-runs a package whose worker died only after this + 10 s, so keep it near real need.
    job_timeout_s: float = 20.0
    max_tries: int = 8  # runs of one package (crashes, timeouts) before its items fail
    result_ttl_s: int = 24 * 3600
    # A job's stored result at most (JSON bytes): Redis holds every result for result_ttl_s,
    # so one request must not store tens of MB. Checked before running where it can be known.
    max_result_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024)
    retry_backoff_s: float = 0.5  # first wait when the backend is unavailable
    retry_backoff_max_s: float = 5.0
    shutdown_grace_s: float = 10.0
    # The collector's thresholds (gc.set_threshold). Python's default (700, 10, 10) collects
    # the young generation every 700 allocations; a worker holding a few thousand jobs in
    # flight then promotes them all and walks them again in full collections: 0.33-0.76 s of
    # collection per 30 000 bulk jobs against 0.05-0.22 s with these (python -m bench.gc_pauses).
    gc_threshold: tuple[int, int, int] = (25_000, 20, 20)

    metrics_port: int = 0  # 0: no metrics endpoint
    metrics_host: str = "127.0.0.1"
    log_level: str = "INFO"
    log_json: bool = True

    models: list[ModelSpec] = Field(default_factory=lambda: list(DEFAULT_MODELS))
    limits: Limits = Field(default_factory=Limits)

    @model_validator(mode="after")
    def _replicas(self) -> WorkerConfig:
        if self.triton_urls:
            parse_endpoints(self.triton_urls)  # a bad list fails at start, naming the entry
            self.triton_url = self.triton_urls
        return self

    def local_models(self) -> list[ModelSpec]:
        """The models Triton serves (every one but the remote-only)."""
        return [s for s in self.models if not s.remote_only]

    def model_for(self, kind: JobKind, name: str) -> ModelSpec | None:
        for spec in self.models:
            if spec.kind == kind and (name == spec.name or name in spec.aliases):
                return spec
        return None
