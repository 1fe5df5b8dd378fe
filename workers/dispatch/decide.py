"""Where a job runs, and whether it may move: the decisions of dispatch, apart from running jobs.

:class:`Decider` holds what a decision reads (the router and its live policy, the backends'
circuits, the tenants' budgets, the remotes a model may spill to, local load) and answers
four questions: which route and why (:meth:`decide`), whether a job should expire now
rather than later (:meth:`shed`), whether a job that lost its backend may fail over
(:meth:`may_fail_over`), and what a failed remote call means for later jobs
(:meth:`remote_failed`). The batch path and the streamed path ask the same questions.
"""

from __future__ import annotations

import time

from producer.contract import (
    Capability,
    JobKind,
    Route,
    RouteReason,
    RoutingPolicy,
    WorkItem,
    describe_lack,
    get_logger,
    lacking,
    needs,
    refusal,
)

from ..accounting.budgets import Budgets
from ..backends.remote.config import RemoteConfig
from ..backends.remote.providers import RemotePool
from ..core.circuit import CircuitBreaker
from ..core.errors import BudgetExceeded, DeadlineShed, InvalidRequest, RemoteLacks, RemoteUnavailable
from ..core.settings import ModelSpec
from ..routing.router import Health, JobView, Router, RouterConfig
from ..routing.signals import LocalLoad, Snapshot
from .plan import failed_at

log = get_logger(__name__)

_HEALTHY = Health()
# Shedding by deadline looks only at jobs this close to their deadline, and sheds only when the
# estimated wait passes it by this margin (an estimate, so it errs towards running the job).
SHED_HORIZON_S = 30.0
SHED_MARGIN_S = 1.0
PEAK_DECAY = 0.98  # per signal sample (2 a second): the remembered peak halves in about 17 s


ItemRefusal = InvalidRequest | BudgetExceeded


class Decider:
    def __init__(
        self,
        router_config: RouterConfig,
        remote_config: RemoteConfig,
        router: Router,
        budgets: Budgets,
        remote: RemotePool | None,
    ) -> None:
        self.router = router
        self.budgets = budgets
        self.remote = remote
        self.remote_config = remote_config
        self.load = LocalLoad()
        self.latest = Snapshot()
        self.triton_circuit = CircuitBreaker(
            "triton",
            failures=router_config.triton_circuit_failures,
            reset_after_s=router_config.triton_circuit_reset_s,
        )
        self.remote_circuit = CircuitBreaker(
            "remote", failures=remote_config.circuit_failures, reset_after_s=remote_config.circuit_reset_s
        )
        self._backends: dict[str, str] = {}  # the live policy's model → backend map
        self._peak_rate: dict[str, float] = {}  # model → fastest local items/s seen lately
        # (kind, model) → monotonic time until which the remote is taken not to serve it.
        self._lacking: dict[tuple[str, str], float] = {}

    # ------------------------------------------------------------------ inputs

    def apply_policy(self, router: RouterConfig, policy: RoutingPolicy) -> None:
        self.router.reconfigure(router)
        self._backends = dict(policy.models)

    def observe(self, snap: Snapshot) -> None:
        self.latest = snap
        self.router.observe(snap)
        self.triton_circuit.probe(snap.triton_ready)
        # The fastest local rate seen lately, per model, for shedding by deadline: kept per sample,
        # so how fast it fades does not depend on how many jobs ask.
        for model in {*snap.local_rate, *self._peak_rate}:
            rate = snap.local_rate.get(model) or 0.0
            self._peak_rate[model] = max(rate, self._peak_rate.get(model, 0.0) * PEAK_DECAY)

    def remote_failed(self, exc: Exception, spec: ModelSpec) -> None:
        """Book a failed remote call: a missing endpoint marks the gap, an outage the circuit."""
        if isinstance(exc, RemoteLacks):
            self._lacking[(spec.kind.value, spec.name)] = (
                time.monotonic() + self.remote_config.unsupported_recheck_s
            )
            log.warning("remote does not serve this; its jobs stay local", model=spec.name, error=exc.message)
        elif isinstance(exc, RemoteUnavailable):
            self.remote_circuit.record_failure()
        failed_at(exc, Route.remote)

    # ------------------------------------------------------------------ decisions

    def decide(self, item: WorkItem, spec: ModelSpec) -> tuple[Route, RouteReason]:
        if spec.remote_only:
            return Route.remote, RouteReason.remote_only  # no local model: the policy has nothing to weigh
        eligible = self.eligible(item, spec)
        if eligible and self.budgets.exceeded(item.tenant):
            return Route.local, RouteReason.budget_exceeded  # it waits for local capacity instead
        backend = self._backends.get(spec.name)
        if backend == "local" and item.route != "remote":
            return Route.local, RouteReason.policy
        if backend == "remote" and eligible and item.route != "local" and self.remote_circuit.allow():
            return Route.remote, RouteReason.policy
        job = JobView(
            model=spec.name,
            lane=item.lane,
            route=item.route,
            local_only=item.local_only,
            seconds_left=item.deadline_at - time.time(),
            eligible=eligible,
        )
        if item.local_only or item.route == "local" or not eligible:
            # The job cannot leave: the policy's answer depends on nothing sampled.
            return self.router.decide(job, _HEALTHY, 0.0)
        health = Health(triton_ok=self.triton_circuit.allow(), remote_ok=self.remote_circuit.allow())
        rate = self.latest.local_rate.get(spec.name)
        wait_s = self.load.estimated_wait_s(spec.name, rate, item.lane)
        return self.router.decide(job, health, wait_s)

    def by_capability(self, item: WorkItem, spec: ModelSpec) -> RouteReason | ItemRefusal | None:
        """A chat job needing what the local model lacks (tools, response_format, logprobs, a
        longer context): ``capability`` when a remote that offers it may take the job, the
        refusal naming the field otherwise (:func:`producer.contract.refusal`, as the API's);
        None when the usual rules decide."""
        if item.kind != JobKind.chat:
            return None
        local = None if spec.remote_only else spec.offers
        if local is not None and not lacking(item.body, local):
            return None
        if self.remote is None or not self.remote.serves(spec):
            if spec.remote_only:
                return None  # the remote-only rules say no remote serves it
            remote = None
        else:
            remote = self.remote.offers(spec)
        why = refusal(item.body, spec.name, local, remote, item.local_only or item.route == "local")
        if why is None and not (self.remote is not None and self.remote.serves(spec, item)):
            # The remotes offer it between them, but no one of them offers all it needs.
            why = describe_lack(
                spec.name, needs(item.body) or {Capability.context: "messages"}, "on any one remote"
            )
        if why is not None:
            return InvalidRequest(why[0])
        if spec.remote_only:
            return None
        if self.budgets.exceeded(item.tenant):
            return BudgetExceeded(self.over_budget(item.tenant, spec, "needs a remote"))
        return RouteReason.capability

    def shed(self, item: WorkItem, spec: ModelSpec, now: float) -> DeadlineShed | None:
        """A job the local work ahead would take past its deadline expires now, not later."""
        left = item.deadline_at - now
        if left > SHED_HORIZON_S:
            return None  # far from its deadline: no estimate is needed
        # The fastest rate seen lately, not the current one: at the start of a burst the current
        # rate is still low, and a wait estimated from it would shed jobs that can make it.
        peak = self._peak_rate.get(spec.name, 0.0)
        if peak <= 0:
            return None  # no measure of capacity yet: run it
        wait = self.load.ahead_of(spec.name, item.lane) / peak
        if wait <= left + SHED_MARGIN_S:
            return None
        message = (
            f"about {wait:.1f} s of work was ahead of it on its backend, {max(left, 0):.1f} s to its deadline"
        )
        return failed_at(
            DeadlineShed(f"the job could not finish before its deadline: {message}"), Route.local
        )

    def eligible(self, item: WorkItem, spec: ModelSpec) -> bool:
        """May this job go to a remote at all (a remote serves its model, it may leave)?"""
        return (
            self.remote is not None
            and not item.local_only
            and self.remote.serves(spec, item)
            and not self._remote_lacks(spec)
        )

    def may_fail_over(self, item: WorkItem, spec: ModelSpec) -> bool:
        """May a job whose local backend is down go to a remote now?"""
        if item.route == "local" or self.router.config.gateway_mode == "triton":
            return False
        if self.budgets.exceeded(item.tenant):
            return False
        return self.eligible(item, spec) and self.remote_circuit.allow()

    def over_budget(self, tenant: str, spec: ModelSpec, why: str = "runs only on a remote") -> str:
        return (
            f"tenant {tenant!r} has spent ${self.budgets.spent(tenant):.4f} on remotes this month, "
            f"its budget is ${self.budgets.budget(tenant):.4f}; this job of model {spec.name!r} {why}"
        )

    def _remote_lacks(self, spec: ModelSpec) -> bool:
        until = self._lacking.get((spec.kind.value, spec.name))
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._lacking[(spec.kind.value, spec.name)]  # time to probe again: the next job tries
        return False


__all__ = ["Decider", "PEAK_DECAY", "SHED_HORIZON_S", "SHED_MARGIN_S"]
