"""Job kinds, lanes, routes and states: the vocabulary every other contract module uses."""

from __future__ import annotations

from enum import StrEnum


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


class ErrorType(StrEnum):
    """A failed, cancelled or expired job's ``error.type``: wire values, documented in docs/api.md."""

    invalid_request = "invalid_request"  # the body fails the contract
    limit_exceeded = "limit_exceeded"  # the body passes a size limit
    model_not_found = "model_not_found"
    model_error = "model_error"  # the model rejected this item
    item_error = "item_error"
    deadline_exceeded = "deadline_exceeded"
    budget_exceeded = "budget_exceeded"  # a remote-only job of a tenant past its remote budget
    remote_rejected = "remote_rejected"  # the remote refused this request (4xx)
    stream_interrupted = "stream_interrupted"  # the backend failed after the first token
    stream_diverged = "stream_diverged"  # a re-run generated other text than the stream carries
    cancelled = "cancelled"
    worker_crashed = "worker_crashed"  # the package's worker died on it too many times
    internal_error = "internal_error"
    # Backend failures: a job ends with one only when it cannot wait for the backend any more.
    backend_error = "backend_error"
    backend_unavailable = "backend_unavailable"
    inference_failed = "inference_failed"
    remote_unavailable = "remote_unavailable"
    remote_unsupported = "remote_unsupported"
    remote_bad_response = "remote_bad_response"


class RouteReason(StrEnum):
    """Why a job ran where it ran: a result's ``route_reason`` and the routes metric's label."""

    forced = "forced"  # the job asked for its route (or local_only)
    primary = "primary"  # the gateway mode's own backend
    ratio = "ratio"  # the hybrid split sent it to the remote
    overflow = "overflow"  # local was saturated past the job's wait budget
    failover = "failover"  # its backend was down
    policy = "policy"  # the live policy maps its model to a backend
    remote_only = "remote_only"  # its model is served only by remotes
    budget_exceeded = "budget_exceeded"  # its tenant is past its remote budget: it waits locally
    cost_local = "cost_local_fits_deadline"  # cost-aware routing kept it local within its deadline
    cache = "cache"  # answered from the result cache
    capability = "capability"  # it needs what only a remote offers (tools, response_format, ...)


TERMINAL = frozenset({Status.succeeded, Status.failed, Status.cancelled, Status.expired})

# Default deadlines: an interactive caller is waiting, a bulk one has the night.
LANE_DEADLINE_S = {Lane.interactive: 120.0, Lane.bulk: 24 * 3600.0}
# The furthest deadline a job may ask for: it bounds how long its record and package live.
LANE_MAX_DEADLINE_S = {Lane.interactive: 3600.0, Lane.bulk: 7 * 24 * 3600.0}
