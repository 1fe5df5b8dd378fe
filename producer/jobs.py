"""The contract between producers and workers.

Everything both sides must agree on lives here and nowhere else: job kinds and their
request bodies (the OpenAI / Cohere shapes), job options, the result envelope, the Redis
key layout, the job state machine (as Lua scripts, so transitions are atomic), and the
wire serialisation (msgpack for arq jobs, JSON for records; never pickle).

Workers import this module and nothing else from ``producer``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import msgpack
from arq.constants import job_key_prefix
from arq.jobs import serialize_job
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "KEY_VERSION",
    "TASK_NAME",
    "TERMINAL",
    "WEBHOOK_TASK",
    "ChatRequest",
    "DeadLetter",
    "Delivery",
    "DeliveryState",
    "EmbeddingRequest",
    "ErrorInfo",
    "InvalidBody",
    "JobKind",
    "JobOptions",
    "JobResult",
    "Keys",
    "Lane",
    "Limits",
    "LimitExceeded",
    "RerankRequest",
    "TenantSpec",
    "TenantsFile",
    "Route",
    "Status",
    "Timings",
    "Webhook",
    "WorkItem",
    "dumps",
    "loads",
    "add_delivery",
    "add_package",
    "hash_api_key",
    "load_tenants",
    "wake_channel",
    "webhook_id_for",
    "webhook_secret_bytes",
    "new_job_id",
    "parse_body",
    "pack_job",
    "unpack_job",
    "request_fingerprint",
]

KEY_VERSION = "v1"
TASK_NAME = "run_items"  # the arq function every work package calls


class JobKind(StrEnum):
    chat = "chat"
    embed = "embed"
    rerank = "rerank"


class Lane(StrEnum):
    interactive = "interactive"
    bulk = "bulk"


class Route(StrEnum):
    auto = "auto"
    local = "local"
    remote = "remote"
    cache = "cache"  # only ever in results


class Status(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    expired = "expired"


TERMINAL = frozenset({Status.succeeded, Status.failed, Status.cancelled, Status.expired})

# Default deadlines: an interactive caller is waiting, a bulk one has the night.
LANE_DEADLINE_S = {Lane.interactive: 120.0, Lane.bulk: 24 * 3600.0}


class Limits(BaseModel):
    """Size limits per kind, enforced at submission and again in the worker."""

    max_embed_inputs: int = 2048
    max_input_chars: int = 32_000
    max_rerank_documents: int = 1000
    max_chat_messages: int = 64
    max_chat_chars: int = 32_000
    max_chat_tokens: int = 512


DEFAULT_LIMITS = Limits()


# ---------------------------------------------------------------------------- bodies


class _Body(BaseModel):
    # Unknown OpenAI fields are accepted and ignored, as an OpenAI server does for most.
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)


class EmbeddingRequest(_Body):
    """The OpenAI ``/v1/embeddings`` request body."""

    input: str | list[str]
    # base64: little-endian float32 bytes, base64-encoded (the openai SDK's default). It is also
    # the cheaper format to store, move and parse: a quarter of the bytes, no float printing.
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _non_empty(cls, v: str | list[str]) -> str | list[str]:
        texts = [v] if isinstance(v, str) else v
        if not texts:
            raise ValueError("input must not be an empty list")
        for i, t in enumerate(texts):
            if not t.strip():
                raise ValueError(f"input[{i}] is empty")
        return v

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    def check_limits(self, limits: Limits) -> None:
        texts = self.texts()
        if len(texts) > limits.max_embed_inputs:
            raise LimitExceeded(f"input has {len(texts)} items; the limit is {limits.max_embed_inputs}")
        for i, t in enumerate(texts):
            if len(t) > limits.max_input_chars:
                raise LimitExceeded(
                    f"input[{i}] has {len(t)} characters; the limit is {limits.max_input_chars}"
                )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Body):
    """The OpenAI ``/v1/chat/completions`` request body (text only, no tools, no streaming)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    tools: list[Any] | None = None

    @model_validator(mode="after")
    def _unsupported(self) -> ChatRequest:
        if self.n != 1:
            raise ValueError("n > 1 is not supported")
        if self.stream:
            raise ValueError("stream is not supported: submit a job and poll, or use a webhook")
        if self.tools:
            raise ValueError("tools are not supported")
        return self

    def token_budget(self, limits: Limits) -> int:
        return min(self.max_completion_tokens or self.max_tokens or 128, limits.max_chat_tokens)

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def check_limits(self, limits: Limits) -> None:
        if len(self.messages) > limits.max_chat_messages:
            raise LimitExceeded(f"{len(self.messages)} messages; the limit is {limits.max_chat_messages}")
        chars = sum(len(m.content) for m in self.messages)
        if chars > limits.max_chat_chars:
            raise LimitExceeded(f"messages hold {chars} characters; the limit is {limits.max_chat_chars}")
        asked = self.max_completion_tokens or self.max_tokens or 0
        if asked > limits.max_chat_tokens:
            raise LimitExceeded(f"max_tokens {asked} exceeds the limit {limits.max_chat_tokens}")


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str


class RerankRequest(_Body):
    """The Cohere/Jina ``/v1/rerank`` request body."""

    query: str = Field(min_length=1)
    documents: list[str | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]

    def check_limits(self, limits: Limits) -> None:
        if len(self.documents) > limits.max_rerank_documents:
            raise LimitExceeded(
                f"{len(self.documents)} documents; the limit is {limits.max_rerank_documents}"
            )
        for i, t in enumerate([self.query, *self.texts()]):
            if len(t) > limits.max_input_chars:
                where = "query" if i == 0 else f"documents[{i - 1}]"
                raise LimitExceeded(f"{where} has {len(t)} characters; the limit is {limits.max_input_chars}")


BODY_MODELS: dict[JobKind, type[_Body]] = {
    JobKind.embed: EmbeddingRequest,
    JobKind.chat: ChatRequest,
    JobKind.rerank: RerankRequest,
}


class InvalidBody(ValueError):
    """A request body that does not match its kind's schema or limits."""

    type = "invalid_request"


class LimitExceeded(InvalidBody):
    type = "limit_exceeded"


def parse_body(
    kind: JobKind | str, body: Any, limits: Limits = DEFAULT_LIMITS
) -> EmbeddingRequest | ChatRequest | RerankRequest:
    """Validate ``body`` for ``kind``; raise :class:`InvalidBody` with a readable message."""
    try:
        model = BODY_MODELS[JobKind(kind)]
    except ValueError:
        raise InvalidBody(f"unknown job kind {kind!r}; expected one of chat, embed, rerank") from None
    if not isinstance(body, dict):
        raise InvalidBody(f"body must be a JSON object, not {type(body).__name__}")
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        raise InvalidBody(_describe(exc)) from None
    parsed.check_limits(limits)  # type: ignore[attr-defined]
    return parsed  # type: ignore[return-value]


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------- options


class Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=2000)
    secret_id: str | None = None


class JobOptions(BaseModel):
    """Per-job options. ``deadline`` is seconds from now (< 10^9) or an absolute epoch."""

    model_config = ConfigDict(extra="forbid")

    lane: Lane = Lane.interactive
    deadline: float | None = Field(default=None, gt=0)
    route: Literal["auto", "local", "remote"] = "auto"
    local_only: bool = False
    webhook: Webhook | None = None
    idempotency_key: str | None = Field(default=None, max_length=256)
    tenant: str = Field(default="default", min_length=1, max_length=128)
    metadata: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> JobOptions:
        if self.local_only and self.route == "remote":
            raise ValueError("route 'remote' contradicts local_only")
        if len(self.metadata) > 16:
            raise ValueError("metadata holds at most 16 pairs")
        return self

    def deadline_at(self, now: float) -> float:
        if self.deadline is None:
            return now + LANE_DEADLINE_S[self.lane]
        return self.deadline if self.deadline > 1e9 else now + self.deadline


class WorkItem(BaseModel):
    """One job as it travels inside a work package (an arq job may carry many)."""

    id: str
    kind: JobKind
    body: Any  # validated by the worker, not here: a bad body fails its job, not the package
    tenant: str = "default"
    lane: Lane = Lane.interactive
    created_at: float
    deadline_at: float
    route: Literal["auto", "local", "remote"] = "auto"
    local_only: bool = False
    webhook: Webhook | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    attempt: int = 0  # set by the worker from the job record when it starts the job


# ---------------------------------------------------------------------------- results


class ErrorInfo(BaseModel):
    type: str
    message: str


class Timings(BaseModel):
    queued_ms: float = 0.0  # created → picked up by a worker
    batch_ms: float = 0.0  # waiting in the micro-batcher
    infer_ms: float = 0.0  # the backend call that carried this job
    batch_size: int = 0  # items in that backend call
    total_ms: float = 0.0  # created → result written


class JobResult(BaseModel):
    """The result envelope: what ``get``/``wait`` return and what a webhook receives."""

    id: str
    kind: JobKind
    status: Status
    tenant: str = "default"
    route: Route | None = None
    route_reason: str | None = None
    model: str | None = None
    body: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    timings: Timings = Field(default_factory=Timings)
    attempts: int = 0
    created_at: float
    finished_at: float | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


# ---------------------------------------------------------------------------- keys


class Keys:
    """Every Redis key the system uses, under one versioned prefix.

    Several deployments can share a Redis by choosing different prefixes.
    """

    def __init__(self, prefix: str = "overspill") -> None:
        self.root = f"{prefix}:{KEY_VERSION}"

    def job(self, job_id: str) -> str:
        """Hash: status, kind, tenant, created_at, attempts, result (JSON envelope)."""
        return f"{self.root}:job:{job_id}"

    def done(self, job_id: str) -> str:
        """List that receives one element when the job is terminal (long-poll target)."""
        return f"{self.root}:done:{job_id}"

    def reply(self, client_id: str) -> str:
        """List: terminal envelopes of one client's jobs, pushed for its waiters."""
        return f"{self.root}:reply:{client_id}"

    def queue(self, lane: Lane | str) -> str:
        """The arq queue (sorted set) of a lane."""
        return f"{self.root}:queue:{Lane(lane).value}"

    def idempotency(self, tenant: str, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return f"{self.root}:idem:{tenant}:{digest}"

    def cache(self, fingerprint: str) -> str:
        return f"{self.root}:cache:{fingerprint}"

    def stats(self) -> str:
        """Hash of counters the workers publish (batches, items) for reports."""
        return f"{self.root}:stats"

    def webhooks(self) -> str:
        """The arq queue (sorted set) of webhook deliveries, apart from the inference lanes."""
        return f"{self.root}:queue:webhooks"

    def webhook(self, job_id: str) -> str:
        """Hash: a job's webhook delivery state (see :class:`DeliveryState`)."""
        return f"{self.root}:webhook:{job_id}"

    def dead_letters(self, tenant: str) -> str:
        """Hash: webhook_id → :class:`DeadLetter` JSON, per tenant."""
        return f"{self.root}:webhooks:dead:{tenant}"

    def disabled_endpoints(self) -> str:
        """Hash: webhook URL → why it was disabled (it answered 410 Gone)."""
        return f"{self.root}:webhooks:disabled"

    def rate(self, tenant: str) -> str:
        """Hash: a tenant's request token bucket (tokens, ts)."""
        return f"{self.root}:rate:{tenant}"

    def open_jobs(self, tenant: str) -> str:
        """Sorted set: a tenant's jobs not yet known to be terminal (for its queued-jobs limit)."""
        return f"{self.root}:open:{tenant}"

    # Batches (producer/batches.py): uploaded files and OpenAI-style batches over them.

    def file(self, file_id: str) -> str:
        """Hash: an uploaded or generated file's metadata (its bytes live in the file store)."""
        return f"{self.root}:file:{file_id}"

    def files(self, tenant: str) -> str:
        """Sorted set: a tenant's file ids by creation time."""
        return f"{self.root}:files:{tenant}"

    def batch(self, batch_id: str) -> str:
        """Hash: a batch's state (status, timestamps, counts, submission progress)."""
        return f"{self.root}:batch:{batch_id}"

    def batch_lines(self, batch_id: str) -> str:
        """List: one JSON entry per request line, in input order: [custom_id, job_id, error]."""
        return f"{self.root}:batch:{batch_id}:lines"

    def batch_lease(self, batch_id: str) -> str:
        """String: which driver works on the batch now (expires if that driver dies)."""
        return f"{self.root}:batch:{batch_id}:lease"

    def batches(self, tenant: str) -> str:
        """Sorted set: a tenant's batch ids by creation time."""
        return f"{self.root}:batches:{tenant}"

    def active_batches(self) -> str:
        """Set: batches not yet in a terminal state, for the drivers to resume."""
        return f"{self.root}:batches:active"


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def request_fingerprint(kind: JobKind | str, body: dict[str, Any]) -> str:
    canonical = json.dumps({"kind": str(kind), "body": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# ---------------------------------------------------------------------------- wire


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def loads(data: str | bytes) -> Any:
    return json.loads(data)


def pack_job(obj: Any) -> bytes:
    """arq ``job_serializer``: msgpack, so no pickle ever crosses Redis."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack_job(data: bytes) -> Any:
    """arq ``job_deserializer``."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def wake_channel(queue: str) -> str:
    """The pub/sub channel that tells a queue's workers a package was queued (poll now)."""
    return f"{queue}:wake"


# arq drops a job not started within its expiry without running it: keep that past every deadline.
ARQ_EXPIRY_GRACE_MS = 24 * 3600 * 1000


def add_package(
    pipe: Any,
    keys: Keys,
    items: list[WorkItem],
    lane: Lane | str,
    *,
    job_try: int | None = None,
    defer_s: float = 0.0,
    retries: int = 0,
    crashes: int = 0,
) -> str:
    """Queue one work package (an arq job carrying ``items``) on a Redis pipeline.

    Written in arq's own job format with our msgpack serializer, so packages can be queued
    in the same pipeline as the item records they belong to.
    """
    package_id = "pkg_" + secrets.token_hex(12)
    run_at_ms = int((time.time() + defer_s) * 1000)
    # retries: times these items found no backend; crashes: runs that died or timed out.
    payload = {
        "items": [i.model_dump(mode="json", exclude_none=True) for i in items],
        "retries": retries,
        "crashes": crashes,
    }
    data = serialize_job(TASK_NAME, (payload,), {}, job_try, run_at_ms, serializer=pack_job)
    latest = max(i.deadline_at for i in items)
    expiry_ms = max(int((latest - time.time()) * 1000), 0) + ARQ_EXPIRY_GRACE_MS
    pipe.psetex(job_key_prefix + package_id, expiry_ms, data)
    queue = keys.queue(lane)
    pipe.zadd(queue, {package_id: run_at_ms})
    if not defer_s:
        pipe.publish(wake_channel(queue), "")
    return package_id


# ---------------------------------------------------------------------------- state machine
# Scripts keep each transition atomic: a job reaches exactly one terminal state, whoever
# races (a cancelling producer, a re-run after a killed worker, a duplicate delivery).

# KEYS: job keys. ARGV, 7 per job: record ttl, kind, tenant, lane, created_at, metadata JSON
# and reply list ("" for none). Writes each queued record in one call (not two commands a job).
SUBMIT_FIELDS = 7
LUA_SUBMIT = """
for i, key in ipairs(KEYS) do
  local a = (i - 1) * 7
  redis.call('HSET', key, 'status', 'queued', 'kind', ARGV[a + 2], 'tenant', ARGV[a + 3],
             'lane', ARGV[a + 4], 'created_at', ARGV[a + 5], 'attempts', 0)
  if ARGV[a + 6] ~= '' then redis.call('HSET', key, 'metadata', ARGV[a + 6]) end
  if ARGV[a + 7] ~= '' then redis.call('HSET', key, 'reply', ARGV[a + 7]) end
  redis.call('EXPIRE', key, tonumber(ARGV[a + 1]))
end
return #KEYS
"""

# KEYS: job keys. Returns per key: n > 0 = run it (its n-th attempt), 0 = already terminal,
# -1 = record missing.
LUA_START = """
local out = {}
for i, key in ipairs(KEYS) do
  local s = redis.call('HGET', key, 'status')
  if not s then
    out[i] = -1
  elseif s == 'queued' or s == 'running' then
    redis.call('HSET', key, 'status', 'running')
    out[i] = redis.call('HINCRBY', key, 'attempts', 1)
  else
    out[i] = 0
  end
end
return out
"""

# A record may name its producer's reply list (field ``reply``, see producer/replies.py): the
# terminal envelope is pushed there too, as "<job id> <envelope>", in the same atomic step.
# Only a list under ``<root>:reply:`` is ever written, whatever a record says. A reader that
# went away leaves a list that expires; one that falls behind loses its oldest replies.
REPLY_TTL_S = 300
REPLY_MAX = 100_000
_LUA_REPLY = f"""
local function reply(key, root, envelope)
  local to = redis.call('HGET', key, 'reply')
  local prefix = root .. ':reply:'
  if to and string.sub(to, 1, #prefix) == prefix then
    local id = string.sub(key, #root + 6)
    redis.call('RPUSH', to, id .. ' ' .. envelope)
    redis.call('LTRIM', to, -{REPLY_MAX}, -1)
    redis.call('EXPIRE', to, {REPLY_TTL_S})
  end
end
"""

# KEYS: job1, done1, job2, done2, ...  ARGV: ttl, root, status1, result1, status2, result2, ...
# Returns per job: 1 = written, 0 = was already terminal (left untouched).
LUA_FINISH = (
    _LUA_REPLY
    + """
local ttl = tonumber(ARGV[1])
local root = ARGV[2]
local out = {}
for i = 1, #KEYS / 2 do
  local key, done = KEYS[2 * i - 1], KEYS[2 * i]
  local s = redis.call('HGET', key, 'status')
  if s == 'queued' or s == 'running' then
    local envelope = ARGV[2 * i + 2]
    redis.call('HSET', key, 'status', ARGV[2 * i + 1], 'result', envelope)
    redis.call('EXPIRE', key, ttl)
    redis.call('RPUSH', done, '1')
    redis.call('EXPIRE', done, ttl)
    reply(key, root, envelope)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""
)

# KEYS: job, done. ARGV: tenant, result (cancelled envelope), ttl, root.
# Returns 1 = cancelled, 0 = already terminal, 2 = running (cannot cancel), -1 = not found.
LUA_CANCEL = (
    _LUA_REPLY
    + """
local s = redis.call('HGET', KEYS[1], 'status')
if not s or redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
if s == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'result', ARGV[2])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
  redis.call('RPUSH', KEYS[2], '1')
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
  reply(KEYS[1], ARGV[4], ARGV[2])
  return 1
end
if s == 'running' then return 2 end
return 0
"""
)


# ---------------------------------------------------------------------------- tenants
# The tenants file (``OVERSPILL_TENANTS_FILE``) is read by both sides: the API maps API keys
# to tenants and enforces their limits; workers sign each tenant's webhooks with its secrets.
# API keys are stored only as SHA-256 hex digests; webhook secrets must be stored as they are
# (an HMAC needs the key), so the file is a secret and is mounted like one.

WEBHOOK_SECRET_PREFIX = "whsec_"


class TenantSpec(BaseModel):
    """One tenant: its API keys (hashed), webhook secrets and limits."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")
    api_key_sha256: list[str] = Field(default_factory=list)
    # secret id → secrets that sign at the same time (more than one while rotating).
    webhook_secrets: dict[str, list[str]] = Field(default_factory=dict)
    max_queued: int = Field(default=10_000, ge=1)
    rate_per_s: float = Field(default=50.0, gt=0)  # token bucket refill
    burst: int = Field(default=100, ge=1)  # token bucket size

    @field_validator("api_key_sha256")
    @classmethod
    def _hex_digests(cls, v: list[str]) -> list[str]:
        for digest in v:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("api_key_sha256 holds lowercase SHA-256 hex digests, not keys")
        return v

    @field_validator("webhook_secrets")
    @classmethod
    def _secrets(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for secret_id, values in v.items():
            for value in values:
                raw = webhook_secret_bytes(value)
                if not 24 <= len(raw) <= 64:
                    raise ValueError(f"webhook secret {secret_id!r} must decode to 24-64 bytes")
        return v

    def secrets_for(self, secret_id: str | None) -> list[str]:
        return list(self.webhook_secrets.get(secret_id or "default", []))


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: list[TenantSpec]

    @model_validator(mode="after")
    def _unique(self) -> TenantsFile:
        names = [t.name for t in self.tenants]
        if len(names) != len(set(names)):
            raise ValueError("tenant names must be unique")
        digests = [d for t in self.tenants for d in t.api_key_sha256]
        if len(digests) != len(set(digests)):
            raise ValueError("an API key belongs to one tenant only")
        return self


def webhook_secret_bytes(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (Standard Webhooks)."""
    if not secret.startswith(WEBHOOK_SECRET_PREFIX):
        raise ValueError("webhook secrets start with 'whsec_'")
    try:
        return base64.b64decode(secret.removeprefix(WEBHOOK_SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from None


def load_tenants(path: str | Path) -> dict[str, TenantSpec]:
    """Read a tenants JSON file; raise ``ValueError`` naming the problem."""
    try:
        data = json.loads(Path(path).read_text())
        return {t.name: t for t in TenantsFile.model_validate(data).tenants}
    except (OSError, json.JSONDecodeError, ValidationError) as exc:
        raise ValueError(f"tenants file {path}: {exc}") from None


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# ---------------------------------------------------------------------------- webhooks
# After a job is terminal the worker queues one delivery (an arq job on ``Keys.webhooks()``).
# The delivery carries the envelope exactly as it is signed, so every attempt sends the same
# bytes under the same ``webhook-id``.

WEBHOOK_TASK = "deliver_webhook"


class DeliveryState(StrEnum):
    pending = "pending"  # queued, first attempt not made yet
    retrying = "retrying"  # an attempt failed, another is scheduled
    delivered = "delivered"  # the receiver answered 2xx: never sent again
    dead = "dead"  # given up: in the tenant's dead-letter list


class Delivery(BaseModel):
    """One webhook delivery: the payload of a ``deliver_webhook`` arq job."""

    model_config = ConfigDict(extra="forbid")

    webhook_id: str
    job_id: str
    tenant: str
    url: str
    secret_id: str | None = None
    body: str  # the JobResult envelope JSON, signed as is
    attempt: int = 1


class DeadLetter(BaseModel):
    """A delivery that was given up, with the reason; it can be replayed."""

    delivery: Delivery
    error: ErrorInfo
    status_code: int | None = None
    attempts: int
    failed_at: float


def webhook_id_for(job_id: str) -> str:
    """The ``webhook-id`` of a job's callback: stable across attempts and replays."""
    return "msg_" + job_id.removeprefix("job_")


def add_delivery(pipe: Any, keys: Keys, delivery: Delivery, *, defer_s: float = 0.0) -> str:
    """Queue a webhook delivery on a Redis pipeline (arq's job format, msgpack)."""
    arq_id = "wh_" + secrets.token_hex(12)
    run_at_ms = int((time.time() + defer_s) * 1000)
    payload = delivery.model_dump(mode="json")
    data = serialize_job(WEBHOOK_TASK, (payload,), {}, None, run_at_ms, serializer=pack_job)
    pipe.psetex(job_key_prefix + arq_id, int(defer_s * 1000) + ARQ_EXPIRY_GRACE_MS, data)
    pipe.zadd(keys.webhooks(), {arq_id: run_at_ms})
    if not defer_s:
        pipe.publish(wake_channel(keys.webhooks()), "")
    return arq_id
