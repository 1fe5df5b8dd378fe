"""Router: decide per job whether it runs on local Triton or on the remote, and why.

The policy, in order (the first rule that applies wins):

1. ``local_only`` (the data must not leave) and ``route: local`` → local, ``forced``.
2. ``route: remote`` → remote, ``forced`` (local ``failover`` if the remote is down).
3. ``GATEWAY_MODE`` ``triton`` → local; ``remote`` → remote (local ``failover`` if down).
4. hybrid, Triton down (circuit open) → remote, ``failover``.
5. hybrid, a random draw under ``REMOTE_RATIO`` → remote, ``ratio`` (gradual roll-out).
6. hybrid, the model's overflow gate is open *and* the job's estimated local wait exceeds
   its budget → remote, ``overflow``; with ``routing: cost``, local
   (``cost_local_fits_deadline``) instead when that wait still fits the job's deadline and the
   remote would charge for it. Otherwise local, ``primary``.

Rules 2–6 apply only to jobs the remote may take: a remote is configured and serves the
model (embeddings only where it serves the *same* model). Everything else stays local.

The overflow gate is opened by sampled signals with separate enter and leave levels, so it
does not flap; while it is open, each job is compared with the live estimate: an interactive
job may wait ``overflow_wait_enter_ms`` locally, a bulk one until just before its deadline.
So the local side keeps about that much work in flight and only the excess spills.

Cost-aware routing (``routing: cost``) weighs money before latency: local Triton is already
paid for (its marginal cost is nil), so a job stays local whenever its estimated wait fits its
deadline, and spills only when local cannot meet that deadline, or when the remote would
not charge for the model (then it is free too, and the overflow rule decides as before).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import Lane, Route, RouteReason

from ..core.metrics import OVERLOADED
from .signals import Snapshot

GatewayMode = Literal["hybrid", "triton", "remote"]
Routing = Literal["overflow", "cost"]
COST_LOCAL = RouteReason.cost_local  # the route_reason of a job cost-aware routing kept local


class RouterConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="forbid")

    gateway_mode: GatewayMode = "hybrid"
    routing: Routing = "overflow"  # "cost": a job waits locally whenever its deadline allows
    remote_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    # Overflow gate: enter when any signal reaches its enter level, leave when all are at or
    # below their leave levels.
    overflow_wait_enter_ms: float = Field(default=500.0, gt=0)  # also an interactive job's budget
    overflow_wait_leave_ms: float = Field(default=200.0, ge=0)
    overflow_pending_enter: float = 32  # Triton pending requests of the model
    overflow_pending_leave: float = 8
    overflow_queue_ms_enter: float = 100.0  # Triton queue time per execution
    overflow_queue_ms_leave: float = 50.0
    overflow_gpu_enter: float = 0.95
    overflow_gpu_leave: float = 0.85
    overflow_backlog_enter: float = 4096  # items in this worker's batchers
    overflow_backlog_leave: float = 1024
    overflow_queue_depth_enter: float = 500  # packages waiting in a lane's arq queue
    overflow_queue_depth_leave: float = 100
    deadline_margin_s: float = Field(default=1.0, ge=0)  # spare time a local job must keep
    sample_interval_s: float = Field(default=0.5, gt=0)
    triton_circuit_failures: int = Field(default=3, ge=1)
    triton_circuit_reset_s: float = Field(default=2.0, ge=0)


@dataclass(slots=True)
class Hysteresis:
    """A level detector that turns on at ``enter`` and off only at ``leave`` (<= enter)."""

    enter: float
    leave: float
    active: bool = False

    def update(self, value: float) -> bool:
        if self.active and value <= self.leave:
            self.active = False
        elif not self.active and value >= self.enter:
            self.active = True
        return self.active


@dataclass(slots=True)
class OverloadGate:
    """One model's overflow gate: open while any of its signals is active."""

    levels: dict[str, Hysteresis] = field(default_factory=dict)

    @classmethod
    def from_config(cls, c: RouterConfig) -> OverloadGate:
        return cls(
            {
                "wait_ms": Hysteresis(c.overflow_wait_enter_ms, c.overflow_wait_leave_ms),
                "pending": Hysteresis(c.overflow_pending_enter, c.overflow_pending_leave),
                "queue_ms": Hysteresis(c.overflow_queue_ms_enter, c.overflow_queue_ms_leave),
                "gpu_util": Hysteresis(c.overflow_gpu_enter, c.overflow_gpu_leave),
                "backlog": Hysteresis(c.overflow_backlog_enter, c.overflow_backlog_leave),
                "queue_depth": Hysteresis(c.overflow_queue_depth_enter, c.overflow_queue_depth_leave),
            }
        )

    def update(self, values: dict[str, float]) -> bool:
        for name, value in values.items():
            self.levels[name].update(value)
        return self.open

    @property
    def open(self) -> bool:
        return any(level.active for level in self.levels.values())


@dataclass(frozen=True, slots=True)
class JobView:
    """What the policy needs to know about one job."""

    model: str
    lane: Lane = Lane.interactive
    route: str = "auto"  # the job's option: auto | local | remote
    local_only: bool = False
    seconds_left: float = 120.0
    eligible: bool = True  # a remote is configured and may serve this model


@dataclass(frozen=True, slots=True)
class Health:
    triton_ok: bool = True
    remote_ok: bool = True


Decision = tuple[Route, str]


class Router:
    def __init__(
        self,
        config: RouterConfig,
        triton_models: dict[str, str],
        *,
        rng: random.Random | None = None,
        charged: Callable[[str], bool] | None = None,
    ) -> None:
        """``triton_models`` maps each model name to the Triton model that serves it;
        ``charged(model)`` says whether the remote that would take it charges for it."""
        self.config = config
        self._triton_models = triton_models
        self._rng = rng or random.Random()
        self._charged = charged or (lambda _model: True)
        self._gates = {name: OverloadGate.from_config(config) for name in triton_models}

    def reconfigure(self, config: RouterConfig) -> None:
        """A new policy in force; the gates start afresh only when their levels changed."""
        levels = OverloadGate.from_config(config).levels
        if levels != OverloadGate.from_config(self.config).levels:
            self._gates = {name: OverloadGate.from_config(config) for name in self._triton_models}
        self.config = config

    def observe(self, snap: Snapshot) -> None:
        """Feed one sample of the signals to every model's gate."""
        depth = float(max(snap.queue_depth.values(), default=0))
        for name, gate in self._gates.items():
            triton = self._triton_models[name]
            gate.update(
                {
                    "wait_ms": snap.wait_ms.get(name, 0.0),
                    "pending": snap.pending.get(triton, 0.0),
                    "queue_ms": snap.queue_ms.get(triton, 0.0),
                    "gpu_util": snap.gpu_util or 0.0,
                    "backlog": float(snap.backlog),
                    "queue_depth": depth,
                }
            )
            OVERLOADED.labels(name).set(int(gate.open))

    def overloaded(self, model: str) -> bool:
        gate = self._gates.get(model)
        return gate is not None and gate.open

    def gate_signals(self) -> dict[str, list[str]]:
        """Per model, the signals that hold its gate open now (none: the gate is closed)."""
        return {
            name: [signal for signal, level in gate.levels.items() if level.active]
            for name, gate in self._gates.items()
        }

    def triton_overloaded(self, triton_model: str) -> bool:
        """Whether a model that ``triton_model`` serves has its gate open (backup replicas then serve)."""
        return any(self.overloaded(name) for name, t in self._triton_models.items() if t == triton_model)

    def budget_s(self, job: JobView) -> float:
        """How long this job may wait locally before it should rather spill."""
        left = job.seconds_left - self.config.deadline_margin_s
        if job.lane == Lane.interactive:
            return min(self.config.overflow_wait_enter_ms / 1000, left)
        return left

    def decide(self, job: JobView, health: Health, wait_s: float) -> Decision:
        """Route one job, given backend health and its estimated local wait ``wait_s``."""
        if job.local_only or job.route == "local":
            return Route.local, RouteReason.forced
        may_remote = job.eligible and health.remote_ok
        if job.route == "remote" or self.config.gateway_mode == "remote":
            reason = RouteReason.forced if job.route == "remote" else RouteReason.primary
            if may_remote:
                return Route.remote, reason
            return (Route.local, RouteReason.failover) if job.eligible else (Route.local, RouteReason.primary)
        if self.config.gateway_mode == "triton" or not may_remote:
            return Route.local, RouteReason.primary
        if not health.triton_ok:
            return Route.remote, RouteReason.failover
        if self.config.remote_ratio and self._rng.random() < self.config.remote_ratio:
            return Route.remote, RouteReason.ratio
        if self.overloaded(job.model) and wait_s > self.budget_s(job):
            if self.cost_keeps_local(job, wait_s):
                return Route.local, COST_LOCAL
            return Route.remote, RouteReason.overflow
        return Route.local, RouteReason.primary

    @property
    def cost_aware(self) -> bool:
        return self.config.routing == "cost"

    def cost_keeps_local(self, job: JobView, wait_s: float) -> bool:
        """Cost-aware: local (free at the margin) meets the deadline, and the remote charges."""
        if not self.cost_aware:
            return False
        return wait_s <= job.seconds_left - self.config.deadline_margin_s and self._charged(job.model)
