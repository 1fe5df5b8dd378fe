"""The live routing policy: what an operator may change without restarting a worker.

A policy document (YAML or JSON) sets any of these fields; those it leaves out keep the
worker's ``OVERSPILL_*`` settings. Workers read it from ``OVERSPILL_POLICY_FILE`` (e.g. a
mounted ConfigMap) or from the Redis key ``Keys.policy()`` (which wins when set), and publish
the policy they apply under ``Keys.policy_effective()``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .documents import first_error, parse_text

Backend = Literal["auto", "local", "remote"]


class RoutingPolicy(BaseModel):
    # Strict: ``true`` is not a millisecond count, nor "1" a ratio (the document says numbers).
    model_config = ConfigDict(extra="forbid", strict=True)

    gateway_mode: Literal["hybrid", "triton", "remote"] | None = None
    remote_ratio: float | None = Field(default=None, ge=0.0, le=1.0)
    # "overflow": spill by the overflow rule (latency first); "cost": among the backends that
    # can meet a job's deadline, the cheapest (an idle local GPU is already paid for).
    routing: Literal["overflow", "cost"] | None = None
    overflow_wait_enter_ms: float | None = Field(default=None, gt=0)
    overflow_wait_leave_ms: float | None = Field(default=None, ge=0)
    overflow_pending_enter: float | None = Field(default=None, ge=0)
    overflow_pending_leave: float | None = Field(default=None, ge=0)
    overflow_queue_ms_enter: float | None = Field(default=None, ge=0)
    overflow_queue_ms_leave: float | None = Field(default=None, ge=0)
    overflow_backlog_enter: float | None = Field(default=None, ge=0)
    overflow_backlog_leave: float | None = Field(default=None, ge=0)
    overflow_queue_depth_enter: float | None = Field(default=None, ge=0)
    overflow_queue_depth_leave: float | None = Field(default=None, ge=0)
    # model → backend: "remote" sends every job of it to a remote that serves it, "local" keeps
    # every job local, "auto" (or absent) leaves it to the rules above.
    models: dict[str, Backend] = Field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """The router settings it sets (the fields given, without the model map)."""
        return self.model_dump(exclude_none=True, exclude={"models"})


class PolicyError(ValueError):
    """A policy document that does not parse or does not validate."""


def parse_policy(text: str | bytes, source: str) -> RoutingPolicy:
    try:
        data = parse_text(text, source) if text else {}
    except ValueError as exc:
        raise PolicyError(str(exc)) from None
    try:
        return RoutingPolicy.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise PolicyError(f"{source}: {first_error(exc)}") from None


def policy_json(policy: RoutingPolicy) -> str:
    return json.dumps(policy.model_dump(exclude_none=True), sort_keys=True)
