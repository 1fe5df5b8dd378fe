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


TERMINAL = frozenset({Status.succeeded, Status.failed, Status.cancelled, Status.expired})

# Default deadlines: an interactive caller is waiting, a bulk one has the night.
LANE_DEADLINE_S = {Lane.interactive: 120.0, Lane.bulk: 24 * 3600.0}
# The furthest deadline a job may ask for: it bounds how long its record and package live.
LANE_MAX_DEADLINE_S = {Lane.interactive: 3600.0, Lane.bulk: 7 * 24 * 3600.0}
