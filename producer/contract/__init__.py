"""The contract between producers and workers: the only part of ``producer`` that ``workers``
imports.

One module per concept (kinds, bodies, options, envelope, keys, wire, scripts, tenants,
deliveries, logs); it imports nothing of the project but itself.
"""

from __future__ import annotations

from .bodies import (
    BODY_MODELS,
    DEFAULT_LIMITS,
    ChatMessage,
    ChatRequest,
    EmbeddingRequest,
    InvalidBody,
    LimitExceeded,
    Limits,
    RerankDocument,
    RerankRequest,
    parse_body,
)
from .deliveries import WEBHOOK_TASK, DeadLetter, Delivery, DeliveryState, add_delivery, webhook_id_for
from .envelope import ErrorInfo, JobResult, Timings
from .keys import KEY_VERSION, Keys, new_job_id, redis_url_with_secret, request_fingerprint, valid_id
from .kinds import LANE_DEADLINE_S, LANE_MAX_DEADLINE_S, TERMINAL, JobKind, Lane, Route, Status
from .logs import configure_logging, get_logger, redact_url
from .options import JobOptions, Webhook, WorkItem
from .portable import MAX_DEPTH, portable_problem, printable
from .scripts import (
    LUA_CANCEL,
    LUA_COLLECT,
    LUA_FINISH,
    LUA_START,
    LUA_SUBMIT,
    REPLY_MAX,
    REPLY_TTL_S,
    SUBMIT_FIELDS,
)
from .tenants import (
    WEBHOOK_SECRET_PREFIX,
    TenantsFile,
    TenantSpec,
    hash_api_key,
    load_tenants,
    new_api_key,
    webhook_secret_bytes,
)
from .wire import (
    ARQ_EXPIRY_GRACE_MS,
    TASK_NAME,
    add_package,
    dumps,
    loads,
    pack_job,
    unpack_job,
    wake_channel,
)

__all__ = [
    "ARQ_EXPIRY_GRACE_MS",
    "BODY_MODELS",
    "ChatMessage",
    "ChatRequest",
    "DEFAULT_LIMITS",
    "DeadLetter",
    "Delivery",
    "DeliveryState",
    "EmbeddingRequest",
    "ErrorInfo",
    "InvalidBody",
    "JobKind",
    "JobOptions",
    "JobResult",
    "KEY_VERSION",
    "Keys",
    "LANE_DEADLINE_S",
    "MAX_DEPTH",
    "LANE_MAX_DEADLINE_S",
    "LUA_CANCEL",
    "LUA_COLLECT",
    "LUA_FINISH",
    "LUA_START",
    "LUA_SUBMIT",
    "Lane",
    "LimitExceeded",
    "Limits",
    "REPLY_MAX",
    "REPLY_TTL_S",
    "RerankDocument",
    "RerankRequest",
    "Route",
    "SUBMIT_FIELDS",
    "Status",
    "TASK_NAME",
    "TERMINAL",
    "TenantSpec",
    "TenantsFile",
    "Timings",
    "WEBHOOK_SECRET_PREFIX",
    "WEBHOOK_TASK",
    "Webhook",
    "WorkItem",
    "add_delivery",
    "add_package",
    "configure_logging",
    "dumps",
    "get_logger",
    "hash_api_key",
    "new_api_key",
    "valid_id",
    "portable_problem",
    "printable",
    "redact_url",
    "redis_url_with_secret",
    "load_tenants",
    "loads",
    "new_job_id",
    "pack_job",
    "parse_body",
    "request_fingerprint",
    "unpack_job",
    "wake_channel",
    "webhook_id_for",
    "webhook_secret_bytes",
]
