"""Cost-aware routing (``routing: cost``): among the backends that meet a job's deadline, the cheapest.

Pure units of the rule, then real worker processes, real Triton (the fixed-cost model slowed
to 200 ms an execution), the fake remotes over HTTP, and the ledger's ``saved`` read from Redis.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from producer import Client
from producer.contract import (
    JobResult,
    Keys,
    Lane,
    PolicyError,
    Route,
    day_of,
    parse_policy,
    read_usage,
    what_if,
)
from stack.processes import free_port
from workers.backends.remote import ProvidersFile, RemoteConfig, RemotePool
from workers.core import WorkerConfig
from workers.routing import Snapshot
from workers.routing.router import COST_LOCAL, Health, JobView, Router, RouterConfig

from .conftest import Triton, WorkerFactory
from .fixtures_remote import FakeRemote
from .test_overflow import INPUTS, embed, slow_triton, submit_at_rate  # noqa: F401  (a fixture)
from .test_policy import metric
from .test_providers import (  # noqa: F401  (fixtures)
    CATALOGUE,
    REMOTE_CHAT,
    chat,
    remote_entry,
    second_remote,
    second_remote_server,
)

MODEL = "fixed-cost"
EMBED_PRICE = 0.02  # $ / 1M input tokens of fixed-cost at the remote


def router(charged: bool = True, **config: Any) -> Router:
    r = Router(
        RouterConfig(**config), {MODEL: "fixed_cost"}, rng=random.Random(0), charged=lambda _m: charged
    )
    r.observe(Snapshot(wait_ms={MODEL: 5000.0}))  # the overflow gate open
    assert r.overloaded(MODEL)
    return r


class TestTheRule:
    def test_a_job_whose_deadline_local_meets_stays_local(self) -> None:
        job = JobView(model=MODEL, lane=Lane.interactive, seconds_left=30.0)
        assert router().decide(job, Health(), wait_s=5.0) == (Route.remote, "overflow")  # the default
        assert router(routing="cost").decide(job, Health(), wait_s=5.0) == (Route.local, COST_LOCAL)

    def test_a_deadline_local_cannot_meet_goes_remote(self) -> None:
        job = JobView(model=MODEL, lane=Lane.interactive, seconds_left=3.0)
        assert router(routing="cost").decide(job, Health(), wait_s=2.5) == (Route.remote, "overflow")

    def test_a_remote_that_does_not_charge_spills_as_before(self) -> None:
        job = JobView(model=MODEL, seconds_left=30.0)
        assert router(False, routing="cost").decide(job, Health(), wait_s=5.0) == (Route.remote, "overflow")

    def test_bulk_with_hours_left_waits_in_either_mode(self) -> None:
        job = JobView(model=MODEL, lane=Lane.bulk, seconds_left=4 * 3600.0)
        for r in (router(), router(routing="cost")):
            assert r.decide(job, Health(), wait_s=600.0) == (Route.local, "primary")

    def test_local_only_and_triton_down_are_unchanged(self) -> None:
        r = router(routing="cost")
        assert r.decide(JobView(model=MODEL, local_only=True), Health(), 500.0) == (Route.local, "forced")
        assert r.decide(JobView(model=MODEL), Health(triton_ok=False), 0.0) == (Route.remote, "failover")

    def test_the_policy_document_sets_it_and_refuses_other_values(self) -> None:
        assert parse_policy('{"routing": "cost"}', "t").settings() == {"routing": "cost"}
        with pytest.raises(PolicyError, match="routing"):
            parse_policy("routing: cheapest", "t")


def pool_of(doc: dict[str, Any]) -> RemotePool:
    config = WorkerConfig(models=CATALOGUE)  # type: ignore[call-arg]
    return RemotePool.build(config, None, RemoteConfig(), ProvidersFile.model_validate(doc))


def test_the_cheapest_remote_first_only_when_cost_aware() -> None:
    doc = {
        "remotes": [
            {"name": "dear", "base_url": "http://a", "models": {REMOTE_CHAT: ""},
             "prices": {REMOTE_CHAT: {"input_per_1m": 1, "output_per_1m": 4}}},
            {"name": "unpriced", "base_url": "http://b", "models": {REMOTE_CHAT: ""}},
            {"name": "cheap", "base_url": "http://c", "models": {REMOTE_CHAT: ""},
             "prices": {REMOTE_CHAT: {"input_per_1m": 0.1, "output_per_1m": 0.4}}},
        ]
    }  # fmt: skip
    pool = pool_of(doc)
    spec = next(s for s in CATALOGUE if s.name == REMOTE_CHAT)
    assert [p.name for p in pool.candidates(spec)] == ["dear", "unpriced", "cheap"]
    assert pool.price(None, REMOTE_CHAT).input_per_1m == 1  # type: ignore[union-attr]
    pool.cost_aware = lambda: True
    assert [p.name for p in pool.candidates(spec)] == ["cheap", "dear", "unpriced"]
    assert pool.price(None, REMOTE_CHAT).input_per_1m == 0.1  # type: ignore[union-attr]
    assert pool.charges(REMOTE_CHAT) and not pool.charges("SmolLM2-135M-Instruct")


# ---------------------------------------------------------------------------- end to end


def cost_settings(fake: FakeRemote, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    doc = {
        "remotes": [
            {
                "name": "a",
                "base_url": fake.base_url,
                "models": {MODEL: ""},
                "same_models": [MODEL],
                "prices": {MODEL: {"input_per_1m": EMBED_PRICE}},
                "max_retries": 1,
            }
        ]
    }
    path = tmp_path / "providers.json"
    path.write_text(json.dumps(doc))
    return {
        "providers_file": str(path),
        "remote_backoff_s": 0.05,
        "overflow_wait_enter_ms": 1000,
        "overflow_wait_leave_ms": 400,
        "job_timeout_s": 60,
        **extra,
    }


async def test_under_overload_jobs_that_can_wait_for_local_do_and_the_ledger_says_what_it_saved(
    client: Client,
    start_worker: WorkerFactory,
    fake_remote: FakeRemote,
    slow_triton: Triton,  # noqa: F811
    tmp_path: Path,
    prefix: str,
) -> None:
    """The load test_overflow spills a third of: 512 items/s offered, 320 items/s local.

    With ``routing: cost``, interactive jobs with 60 s to their deadline wait (local meets it);
    jobs with 1.2 s to theirs (0.2 s after the 1 s margin) cannot wait and spill.
    """
    start_worker(**cost_settings(fake_remote, tmp_path, routing="cost"))

    def make(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        if i % 8 == 7 and i > 100:  # once the gate has had time to open
            return embed(f"hurry {i}"), {"deadline": 1.2}
        return embed(f"patient {i}"), {"deadline": 60}

    submitted = await submit_at_rate(client, rate=64, duration_s=5, make=make)
    results: list[JobResult] = await client.wait_many([job_id for job_id, _ in submitted], timeout=120)

    patient = [r for (_, o), r in zip(submitted, results, strict=True) if o["deadline"] == 60]
    hurried = [r for (_, o), r in zip(submitted, results, strict=True) if o["deadline"] != 60]
    routes = Counter((str(r.route), r.route_reason) for r in patient)
    print(
        f"\ncost routing: patient {dict(routes)}; hurried {Counter((str(r.route), r.route_reason, r.status) for r in hurried)}"
    )
    assert all(r.status == "succeeded" for r in patient)
    assert set(routes) <= {("local", "primary"), ("local", COST_LOCAL)}
    kept = [r for r in patient if r.route_reason == COST_LOCAL]
    assert len(kept) >= 20  # the gate was open and the overflow rule would have spilled these
    assert any((str(r.route), r.route_reason) == ("remote", "overflow") for r in hurried)
    assert not any(str(r.route) == "remote" for r in patient)

    await asyncio.sleep(1.5)  # the ledger's flush
    rows = await read_usage(client.redis, Keys(prefix), [day_of(time.time())])
    saved_by_hand = sum(r.body["usage"]["prompt_tokens"] for r in kept if r.body) * EMBED_PRICE / 1e6
    assert saved_by_hand > 0
    assert what_if(rows)["saved"] == pytest.approx(saved_by_hand, rel=1e-6)
    local = next(r for r in rows if r.route == "local")
    assert local.saved == pytest.approx(saved_by_hand, rel=1e-6)


async def test_the_cheaper_remote_wins_when_cost_aware_switched_live(
    client: Client,
    start_worker: WorkerFactory,
    fake_remote: FakeRemote,
    second_remote: FakeRemote,  # noqa: F811
    tmp_path: Path,
    prefix: str,
) -> None:
    """Remote "a" is first in the fallback order and dearer; the policy key flips the routing."""
    dear = {REMOTE_CHAT: {"input_per_1m": 2.0, "output_per_1m": 8.0}}
    cheap = {REMOTE_CHAT: {"input_per_1m": 0.1, "output_per_1m": 0.4}}
    path = tmp_path / "providers.json"
    path.write_text(
        json.dumps(
            {
                "remotes": [
                    remote_entry("a", fake_remote, prices=dear),
                    remote_entry("b", second_remote, prices=cheap),
                ]
            }
        )
    )
    models = json.dumps([m.model_dump(mode="json") for m in CATALOGUE])
    port = free_port()
    start_worker(
        models=models,
        providers_file=str(path),
        remote_backoff_s=0.05,
        policy_refresh_s=0.25,
        metrics_port=port,
    )

    first = await client.wait_many(
        [await client.submit("chat", chat(f"order {i}")) for i in range(3)], timeout=60
    )
    assert {r.model for r in first} == {f"a/{REMOTE_CHAT}"}

    await client.redis.set(Keys(prefix).policy(), json.dumps({"routing": "cost"}))
    await asyncio.sleep(1.0)  # applied within policy_refresh_s
    second = await client.wait_many(
        [await client.submit("chat", chat(f"price {i}")) for i in range(3)], timeout=60
    )
    assert [(r.status, r.route_reason, r.model) for r in second] == [
        ("succeeded", "remote_only", f"b/{REMOTE_CHAT}")
    ] * 3
    assert len(fake_remote.requests()) == 3 and len(second_remote.requests()) == 3
    assert metric(port, 'overspill_policy_routing{routing="cost"}') == 1
    assert metric(port, 'overspill_policy_routing{routing="overflow"}') == 0
