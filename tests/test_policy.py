"""The live routing policy: changed under load without a restart, refused whole when bad.

Real worker processes, real Triton (the 5 ms fixed-cost model), the fake remote, the API.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from producer import Client
from producer.contract import JobResult, PolicyError, parse_policy
from stack.processes import ManagedProcess, free_port

from .conftest import WorkerFactory
from .fixtures_api import api_url, start_api
from .fixtures_remote import FakeRemote

MODEL = "fixed-cost"


def remote_settings(fake: FakeRemote, **extra: Any) -> dict[str, Any]:
    return {
        "remote_base_url": fake.base_url,
        "remote_same_models": f'["{MODEL}"]',
        "remote_max_retries": 1,
        "policy_refresh_s": 0.25,
        **extra,
    }


def embed(tag: str) -> dict[str, Any]:
    return {"model": MODEL, "input": tag}


@pytest.fixture
def admin(tmp_path: Path) -> dict[str, str]:
    return {"ops": "osk_" + secrets.token_urlsafe(16), "acme": "osk_" + secrets.token_urlsafe(16)}


@pytest.fixture
def api(
    run_dir: Path, redis_url: str, prefix: str, tmp_path: Path, admin: dict[str, str]
) -> Iterator[ManagedProcess]:
    doc = {
        "tenants": [
            {
                "name": name,
                "api_key_sha256": [hashlib.sha256(key.encode()).hexdigest()],
                "admin": name == "ops",
            }
            for name, key in admin.items()
        ]
    }
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(doc))
    proc = start_api(run_dir, redis_url, prefix, path)
    yield proc
    proc.stop()


async def submit_for(client: Client, rate: float, duration_s: float) -> list[tuple[float, str]]:
    """``rate`` jobs/s for ``duration_s`` (bounded in count and time): (submitted at, id) each."""
    out: list[tuple[float, str]] = []
    started = time.monotonic()
    for i in range(int(rate * duration_s)):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.monotonic() - started > duration_s + 5:
            break
        out.append((time.monotonic() - started, await client.submit("embed", embed(f"load {i}"))))
    return out


def remote_share(results: list[JobResult]) -> float:
    return sum(str(r.route) == "remote" for r in results) / len(results)


async def test_a_ratio_changed_under_load_changes_the_split_within_seconds(
    client: Client,
    start_worker: WorkerFactory,
    fake_remote: FakeRemote,
    api: ManagedProcess,
    admin: dict[str, str],
) -> None:
    start_worker(**remote_settings(fake_remote))
    base = api_url(api)
    ops = {"Authorization": f"Bearer {admin['ops']}"}

    async def ramp() -> None:
        await asyncio.sleep(3.0)
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            answer = await http.put("/v1/admin/policy", json={"remote_ratio": 0.5}, headers=ops)
            assert answer.status_code == 200, answer.text

    load, _ = await asyncio.gather(submit_for(client, rate=40, duration_s=8), ramp())
    results = await client.wait_many([job_id for _, job_id in load], timeout=60)
    assert all(r.status == "succeeded" for r in results)
    at = {r.id: t for (t, _), r in zip(load, results, strict=True)}

    before = [r for r in results if at[r.id] < 3.0]
    after = [r for r in results if at[r.id] >= 3.0 + 2.0]  # applied within 2 s of the change
    assert remote_share(before) == 0
    assert len(after) >= 100
    assert 0.35 <= remote_share(after) <= 0.65  # binomial(100+, 0.5): far outside 5 sigma otherwise
    assert {r.route_reason for r in after if str(r.route) == "remote"} == {"ratio"}

    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        shown = (await http.get("/v1/admin/policy", headers=ops)).json()
    assert shown["stored"] == {"models": {}, "remote_ratio": 0.5}
    assert [w["source"] for w in shown["workers"].values()] == ["redis"]
    assert [w["policy"]["remote_ratio"] for w in shown["workers"].values()] == [0.5]


async def test_the_admin_endpoint_refuses_bad_policies_and_other_keys(
    api: ManagedProcess, admin: dict[str, str]
) -> None:
    async with httpx.AsyncClient(base_url=api_url(api), timeout=10) as http:
        ops = {"Authorization": f"Bearer {admin['ops']}"}
        tenant = {"Authorization": f"Bearer {admin['acme']}"}
        assert (await http.get("/v1/admin/policy", headers=tenant)).status_code == 403
        assert (
            await http.put("/v1/admin/policy", json={"remote_ratio": 0.1}, headers=tenant)
        ).status_code == 403
        for bad in ({"remote_ratio": 2}, {"gateway_mode": "sideways"}, {"colour": "blue"}):
            answer = await http.put("/v1/admin/policy", json=bad, headers=ops)
            assert answer.status_code == 400, bad
            assert answer.json()["error"]["param"] == "body"
        answer = await http.put("/v1/admin/policy", content=b"{not json", headers=ops)
        assert answer.status_code == 400
        assert (await http.get("/v1/admin/policy", headers=ops)).json()["stored"] is None


def metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def settled_routes(client: Client, n: int, tag: str) -> set[tuple[str, str | None]]:
    ids = [await client.submit("embed", embed(f"{tag} {i}")) for i in range(n)]
    results = await client.wait_many(ids, timeout=30)
    assert all(r.status == "succeeded" for r in results)
    return {(str(r.route), r.route_reason) for r in results}


async def test_a_bad_policy_file_keeps_the_old_policy_logs_and_counts_it(
    client: Client, start_worker: WorkerFactory, fake_remote: FakeRemote, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("remote_ratio: 1.0\n")
    port = free_port()
    worker = start_worker(**remote_settings(fake_remote, policy_file=str(path), metrics_port=port))
    assert await settled_routes(client, 5, "all out") == {("remote", "ratio")}

    path.write_text("remote_ratio: [1.0\n")  # does not parse
    await asyncio.sleep(1.0)
    assert await settled_routes(client, 5, "still out") == {("remote", "ratio")}
    path.write_text("remote_ratio: 7\n")  # parses, does not validate
    await asyncio.sleep(1.0)
    assert await settled_routes(client, 5, "and still") == {("remote", "ratio")}
    assert metric(port, 'overspill_policy_errors_total{source="file"}') == 2
    assert metric(port, "overspill_policy_remote_ratio") == 1.0
    log = worker.log_path.read_text()
    assert "routing policy refused" in log and "does not parse" in log and "remote_ratio" in log

    # the model → backend map: this model stays local whatever the ratio says
    path.write_text(f"remote_ratio: 1.0\nmodels: {{{MODEL}: local}}\n")
    await asyncio.sleep(1.0)
    assert await settled_routes(client, 5, "home") == {("local", "policy")}
    path.write_text("gateway_mode: triton\n")
    await asyncio.sleep(1.0)
    assert await settled_routes(client, 5, "triton") == {("local", "primary")}
    assert metric(port, 'overspill_policy_mode{mode="triton"}') == 1


def test_policy_documents_are_validated_whole() -> None:
    assert parse_policy("remote_ratio: 0.3\nmodels: {m: remote}", "x").remote_ratio == 0.3
    for text, where in (
        ("remote_ratio: -1", "remote_ratio"),
        ("models: {m: elsewhere}", "models.m"),
        ("[1, 2", "parse"),
    ):
        with pytest.raises(PolicyError, match=where):
            parse_policy(text, "x")
