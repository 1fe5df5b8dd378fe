"""The routing policy, the circuit breaker and the load estimate, as pure units."""

from __future__ import annotations

import random

import pytest

from producer.contract import Lane, Route
from workers.core import CircuitBreaker, CircuitState
from workers.routing import (
    Health,
    Hysteresis,
    JobView,
    LocalLoad,
    ModelCounters,
    Router,
    RouterConfig,
    Snapshot,
    queue_ms_per_exec,
)

MODELS = {"fixed-cost": "fixed_cost", "all-MiniLM-L6-v2": "embedding"}


def router(rng_seed: int = 0, **config: object) -> Router:
    return Router(RouterConfig(**config), MODELS, rng=random.Random(rng_seed))  # type: ignore[arg-type]


def overloaded(r: Router, model: str = "fixed-cost", wait_ms: float = 5000.0) -> Router:
    r.observe(Snapshot(wait_ms={model: wait_ms}))
    assert r.overloaded(model)
    return r


JOB = JobView(model="fixed-cost")


class TestDecide:
    def test_idle_hybrid_stays_local(self) -> None:
        assert router().decide(JOB, Health(), wait_s=0.0) == (Route.local, "primary")

    def test_local_only_never_goes_remote(self) -> None:
        job = JobView(model="fixed-cost", local_only=True, eligible=True)
        for r in (router(gateway_mode="remote"), router(remote_ratio=1.0), overloaded(router())):
            assert r.decide(job, Health(), wait_s=60.0) == (Route.local, "forced")
            assert r.decide(job, Health(triton_ok=False), wait_s=60.0) == (Route.local, "forced")

    def test_forced_routes(self) -> None:
        r = router()
        assert r.decide(JobView(model="fixed-cost", route="local"), Health(), 99.0) == (Route.local, "forced")
        assert r.decide(JobView(model="fixed-cost", route="remote"), Health(), 0.0) == (
            Route.remote,
            "forced",
        )
        down = Health(remote_ok=False)
        assert r.decide(JobView(model="fixed-cost", route="remote"), down, 0.0) == (Route.local, "failover")

    def test_gateway_modes(self) -> None:
        assert router(gateway_mode="remote").decide(JOB, Health(), 0.0) == (Route.remote, "primary")
        assert router(gateway_mode="remote").decide(JOB, Health(remote_ok=False), 0.0) == (
            Route.local,
            "failover",
        )
        triton_only = overloaded(router(gateway_mode="triton", remote_ratio=1.0))
        assert triton_only.decide(JOB, Health(triton_ok=False), 60.0) == (Route.local, "primary")

    def test_ineligible_models_stay_local(self) -> None:
        """An embedding model the remote does not serve identically never spills."""
        job = JobView(model="all-MiniLM-L6-v2", eligible=False)
        r = overloaded(router(gateway_mode="hybrid", remote_ratio=1.0), "all-MiniLM-L6-v2")
        assert r.decide(job, Health(triton_ok=False), 60.0) == (Route.local, "primary")
        assert router(gateway_mode="remote").decide(job, Health(), 0.0) == (Route.local, "primary")

    def test_triton_down_fails_over(self) -> None:
        assert router().decide(JOB, Health(triton_ok=False), 0.0) == (Route.remote, "failover")
        both_down = Health(triton_ok=False, remote_ok=False)
        assert router().decide(JOB, both_down, 0.0) == (Route.local, "primary")

    def test_ratio_sends_about_that_share(self) -> None:
        r = router(remote_ratio=0.25, rng_seed=7)
        routes = [r.decide(JOB, Health(), 0.0) for _ in range(4000)]
        share = sum(route == (Route.remote, "ratio") for route in routes) / len(routes)
        assert share == pytest.approx(0.25, abs=0.03)
        assert all(route in ((Route.remote, "ratio"), (Route.local, "primary")) for route in routes)

    def test_overflow_needs_the_gate_and_a_wait_over_budget(self) -> None:
        r = router(overflow_wait_enter_ms=500)
        assert r.decide(JOB, Health(), wait_s=5.0) == (Route.local, "primary")  # gate closed
        overloaded(r)
        assert r.decide(JOB, Health(), wait_s=0.2) == (Route.local, "primary")  # fits its budget
        assert r.decide(JOB, Health(), wait_s=0.8) == (Route.remote, "overflow")
        assert r.decide(JOB, Health(remote_ok=False), wait_s=0.8) == (Route.local, "primary")

    def test_deadline_aware_bulk_waits_interactive_spills(self) -> None:
        r = overloaded(router(overflow_wait_enter_ms=500, deadline_margin_s=1.0))
        hours = JobView(model="fixed-cost", lane=Lane.bulk, seconds_left=6 * 3600)
        soon = JobView(model="fixed-cost", lane=Lane.bulk, seconds_left=20)
        interactive = JobView(model="fixed-cost", lane=Lane.interactive, seconds_left=120)
        assert r.decide(hours, Health(), wait_s=600.0) == (Route.local, "primary")
        assert r.decide(soon, Health(), wait_s=15.0) == (Route.local, "primary")
        assert r.decide(soon, Health(), wait_s=30.0) == (Route.remote, "overflow")
        assert r.decide(interactive, Health(), wait_s=1.0) == (Route.remote, "overflow")
        tight = JobView(model="fixed-cost", seconds_left=1.2)  # budget = what is left minus margin
        assert r.budget_s(tight) == pytest.approx(0.2)


class TestGate:
    def test_hysteresis_has_separate_enter_and_leave_levels(self) -> None:
        h = Hysteresis(enter=100, leave=40)
        assert [h.update(v) for v in (50, 99, 100, 60, 41, 40, 60, 99)] == [
            False, False, True, True, True, False, False, False,
        ]  # fmt: skip

    def test_gate_opens_on_any_signal_and_closes_when_all_are_low(self) -> None:
        r = router(overflow_queue_ms_enter=100, overflow_queue_ms_leave=50, overflow_wait_enter_ms=500)
        r.observe(Snapshot(queue_ms={"fixed_cost": 150.0}))
        assert r.overloaded("fixed-cost") and not r.overloaded("all-MiniLM-L6-v2")
        r.observe(Snapshot(queue_ms={"fixed_cost": 70.0}, wait_ms={"fixed-cost": 600.0}))
        assert r.overloaded("fixed-cost")
        r.observe(Snapshot(queue_ms={"fixed_cost": 40.0}, wait_ms={"fixed-cost": 300.0}))
        assert r.overloaded("fixed-cost")  # the wait is still above its leave level
        r.observe(Snapshot(queue_ms={"fixed_cost": 40.0}, wait_ms={"fixed-cost": 100.0}))
        assert not r.overloaded("fixed-cost")

    def test_worker_wide_signals_open_every_gate(self) -> None:
        r = router(overflow_queue_depth_enter=500)
        r.observe(Snapshot(queue_depth={"interactive": 10, "bulk": 800}))
        assert r.overloaded("fixed-cost") and r.overloaded("all-MiniLM-L6-v2")
        r = router(overflow_gpu_enter=0.95)
        r.observe(Snapshot(gpu_util=0.99))
        assert r.overloaded("fixed-cost")


class TestCircuit:
    def test_opens_after_failures_and_a_probe_closes_it(self) -> None:
        now = [0.0]
        c = CircuitBreaker("t", failures=3, reset_after_s=2.0, clock=lambda: now[0])
        c.record_failure()
        c.record_failure()
        assert c.allow() and c.state == CircuitState.closed
        c.record_failure()
        assert c.state == CircuitState.open and not c.allow()
        now[0] = 2.5
        assert c.allow() and c.state == CircuitState.half_open  # one trial
        assert not c.allow()  # ... and only one
        c.record_success()
        assert c.state == CircuitState.closed and c.allow()

    def test_failed_probe_reopens_and_a_lost_probe_is_forgotten(self) -> None:
        now = [0.0]
        c = CircuitBreaker("t", failures=1, reset_after_s=1.0, clock=lambda: now[0])
        c.record_failure()
        now[0] = 1.5
        assert c.allow()
        c.record_failure()
        assert c.state == CircuitState.open and not c.allow()
        now[0] = 3.0
        assert c.allow()  # a trial that never reports back ...
        now[0] = 4.5
        assert c.allow()  # ... does not keep the circuit shut

    def test_a_health_probe_that_sees_the_backend_back_closes_it_at_once(self) -> None:
        now = [0.0]
        c = CircuitBreaker("t", failures=3, reset_after_s=30.0, clock=lambda: now[0])
        c.probe(False)
        assert c.state == CircuitState.open and not c.allow()
        now[0] = 0.5
        c.probe(True)  # the next sample: ready again, no waiting out the 30 s
        assert c.state == CircuitState.closed and c.allow()
        for _ in range(3):
            c.record_failure()
        c.probe(True)  # opened by failed calls while probes said up: the reset period holds
        assert c.state == CircuitState.open


class TestLoad:
    def test_littles_law_estimate(self) -> None:
        now = [0.0]
        load = LocalLoad(clock=lambda: now[0])
        assert load.estimated_wait_s("m", rate=None) == 0.0
        a = load.begin("m", 64)
        b = load.begin("m", 64)
        assert load.inflight("m") == 128
        assert load.estimated_wait_s("m", rate=256.0) == pytest.approx(0.5)
        now[0] = 3.0
        assert load.estimated_wait_s("m", rate=None) == pytest.approx(3.0)  # as old as the oldest
        load.end("m", a, done=True)
        load.end("m", b, done=False)
        assert load.inflight("m") == 0 and load.completed == {"m": 64}

    def test_interactive_jobs_wait_only_behind_interactive_items(self) -> None:
        """The batchers serve interactive items first: a bulk backlog does not delay them."""
        load = LocalLoad()
        load.begin("m", 100, Lane.interactive)
        load.begin("m", 900, Lane.bulk)
        assert load.estimated_wait_s("m", rate=100.0, lane=Lane.interactive) == pytest.approx(1.0)
        assert load.estimated_wait_s("m", rate=100.0, lane=Lane.bulk) == pytest.approx(10.0)
        assert load.estimated_wait_s("m", rate=100.0) == pytest.approx(10.0)

    def test_queue_time_per_execution(self) -> None:
        before = ModelCounters(executions=10, queue_us=1_000_000)
        after = ModelCounters(executions=20, queue_us=3_000_000)
        assert queue_ms_per_exec(before, after) == pytest.approx(200.0)
        assert queue_ms_per_exec(after, after) == 0.0
