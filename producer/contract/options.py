"""Per-job options as a producer gives them, and a job as it travels in a work package."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .kinds import LANE_DEADLINE_S, LANE_MAX_DEADLINE_S, JobKind, Lane
from .portable import portable_problem

# An absolute deadline may reach this far past the lane's maximum (clock skew between hosts).
DEADLINE_SLACK_S = 60.0


class Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=2000)
    secret_id: str | None = None


class JobOptions(BaseModel):
    """Per-job options. ``deadline`` is seconds from now (< 10^9) or an absolute epoch."""

    model_config = ConfigDict(extra="forbid")

    lane: Lane = Lane.interactive
    deadline: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    route: Literal["auto", "local", "remote"] = "auto"
    local_only: bool = False
    webhook: Webhook | None = None
    idempotency_key: str | None = Field(default=None, max_length=256)
    tenant: str = Field(default="default", min_length=1, max_length=128)
    metadata: dict[str, str] = Field(default_factory=dict)
    # Chat only: tokens go to the job's Redis Stream as they come (contract/streams.py).
    stream: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> JobOptions:
        if self.local_only and self.route == "remote":
            raise ValueError("route 'remote' contradicts local_only")
        if len(self.metadata) > 16:
            raise ValueError("metadata holds at most 16 pairs")
        strings = {"tenant": self.tenant, "idempotency_key": self.idempotency_key, "metadata": self.metadata}
        if self.webhook is not None:
            strings["webhook"] = [self.webhook.url, self.webhook.secret_id]
        problem = portable_problem(strings, "options")
        if problem is not None:
            raise ValueError(problem)
        self._check_deadline()
        return self

    def _check_deadline(self) -> None:
        """A deadline past the lane's window would keep a record (and its package) for ever."""
        if self.deadline is None:
            return
        window = LANE_MAX_DEADLINE_S[self.lane] + DEADLINE_SLACK_S
        relative = self.deadline if self.deadline <= 1e9 else self.deadline - time.time()
        if relative > window:
            raise ValueError(
                f"deadline is at most {LANE_MAX_DEADLINE_S[self.lane]:g} s away on the {self.lane.value} lane"
            )

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
    stream: bool | None = None  # True: a streamed chat job (None, not False: absent on the wire)
