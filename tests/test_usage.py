"""The usage ledger: what each tenant used and what it cost, per model, route and day.

Real worker, real Triton, a real fake remote, the real API and the installed CLI. The ledger's
tokens must equal the sum over the result envelopes; its cost must equal the providers file's
prices applied here by hand.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from producer import Client
from producer.contract import JobResult, Keys, TenantSpec, day_of, load_tenants, read_usage
from stack.processes import ManagedProcess

from .conftest import WorkerFactory
from .fixtures_api import api_url, start_api
from .fixtures_remote import FakeRemote
from .test_providers import CATALOGUE, REMOTE_CHAT, chat

PRICE_IN, PRICE_OUT = 0.4, 1.6  # $ / 1M tokens of gpt-4.1-mini
EMBED_IN = 0.02  # $ / 1M tokens of all-MiniLM-L6-v2, were it sent to the remote
REPLICA_PER_HOUR = 3600.0  # $1 a GPU-second: local cost reads as GPU-seconds
LOCAL = "all-MiniLM-L6-v2"
OVERSPILL = Path(sys.executable).parent / "overspill"


def write_providers(tmp_path: Path, remote: FakeRemote) -> Path:
    doc = {
        "remotes": [
            {
                "name": "a",
                "base_url": remote.base_url,
                "models": {REMOTE_CHAT: ""},
                "prices": {
                    REMOTE_CHAT: {"input_per_1m": PRICE_IN, "output_per_1m": PRICE_OUT},
                    LOCAL: {"input_per_1m": EMBED_IN},
                },
            }
        ],
        "local": {"replica_per_hour": REPLICA_PER_HOUR},
    }
    path = tmp_path / "providers.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML too
    return path


@pytest.fixture
def keys() -> dict[str, str]:
    return {name: "osk_" + secrets.token_urlsafe(16) for name in ("acme", "globex", "ops")}


@pytest.fixture
def tenants_file(tmp_path: Path, keys: dict[str, str]) -> Path:
    doc = {
        "tenants": [
            {
                "name": name,
                "api_key_sha256": [hashlib.sha256(key.encode()).hexdigest()],
                "admin": name == "ops",
            }
            for name, key in keys.items()
        ]
    }
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def api(run_dir: Path, redis_url: str, prefix: str, tenants_file: Path) -> Iterator[ManagedProcess]:
    proc = start_api(run_dir, redis_url, prefix, tenants_file)
    yield proc
    proc.stop()


def sums(results: list[JobResult], models: list[str]) -> dict[tuple[str, str, str], dict[str, int]]:
    """Tokens per (tenant, model asked for, route), summed over the envelopes."""
    out: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r, model in zip(results, models, strict=True):
        assert r.body is not None and r.route is not None
        usage = r.body["usage"]
        row = out[(r.tenant, model, str(r.route))]
        row["requests"] += 1
        row["prompt_tokens"] += usage.get("prompt_tokens", 0)
        row["completion_tokens"] += usage.get("completion_tokens", 0)
    return out


async def settled_rows(client: Client, prefix: str, tenant: str | None = None) -> list[Any]:
    await asyncio.sleep(1.5)  # workers flush the ledger once a second
    return await read_usage(client.redis, Keys(prefix), [day_of(__import__("time").time())], tenant)


async def test_the_ledger_adds_up_to_the_envelopes_and_the_prices(
    client: Client,
    start_worker: WorkerFactory,
    fake_remote: FakeRemote,
    tmp_path: Path,
    prefix: str,
    redis_url: str,
) -> None:
    models = json.dumps([m.model_dump(mode="json") for m in CATALOGUE])
    start_worker(
        models=models, providers_file=str(write_providers(tmp_path, fake_remote)), cache_enabled="true"
    )

    jobs: list[tuple[str, str, dict[str, Any], str]] = []  # kind, model, body, tenant
    jobs += [("chat", REMOTE_CHAT, chat(f"what does a ledger say {i}"), "acme") for i in range(4)]
    jobs += [
        ("embed", LOCAL, {"model": LOCAL, "input": [f"text {i}", f"and more text {i}"]}, "acme")
        for i in range(6)
    ]
    jobs += [("chat", REMOTE_CHAT, chat("another tenant"), "globex")]
    ids = [await client.submit(kind, body, tenant=tenant) for kind, _, body, tenant in jobs]
    results = await client.wait_many(ids, timeout=60)
    # the same embedding again: a cache hit, booked as route "cache"
    again = await client.wait(await client.submit("embed", jobs[4][2], tenant="acme"), timeout=30)
    results.append(again)
    models_asked = [model for _, model, _, _ in jobs] + [LOCAL]

    assert all(r.status == "succeeded" for r in results), [r.error for r in results]
    assert again.route == "cache"
    expected = sums(results, models_asked)
    rows = await settled_rows(client, prefix)
    got = {(r.tenant, r.model, r.route): r for r in rows}
    assert set(got) == set(expected)
    for key, want in expected.items():
        row = got[key]
        assert (row.requests, row.prompt_tokens, row.completion_tokens) == (
            want["requests"], want["prompt_tokens"], want["completion_tokens"],
        ), key  # fmt: skip

    remote = got[("acme", REMOTE_CHAT, "remote")]
    assert remote.cost == pytest.approx(
        (remote.prompt_tokens * PRICE_IN + remote.completion_tokens * PRICE_OUT) / 1e6
    )
    assert remote.gpu_s == 0
    local = got[("acme", LOCAL, "local")]
    assert local.items == 12 and local.gpu_s > 0
    assert local.cost == pytest.approx(local.gpu_s * REPLICA_PER_HOUR / 3600)
    assert local.remote_cost == pytest.approx(local.prompt_tokens * EMBED_IN / 1e6)
    cached = got[("acme", LOCAL, "cache")]
    assert (cached.items, cached.cost, cached.gpu_s) == (2, 0, 0)


async def test_usage_over_http_tenants_see_their_own_and_admins_all(
    client: Client,
    start_worker: WorkerFactory,
    fake_remote: FakeRemote,
    tmp_path: Path,
    api: ManagedProcess,
    keys: dict[str, str],
    prefix: str,
) -> None:
    """Also: a remote-only model through the synchronous OpenAI endpoint."""
    models = json.dumps([m.model_dump(mode="json") for m in CATALOGUE])
    start_worker(models=models, providers_file=str(write_providers(tmp_path, fake_remote)))
    base = api_url(api)
    auth = {name: {"Authorization": f"Bearer {key}"} for name, key in keys.items()}
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        answer = await http.post("/v1/chat/completions", json=chat("sync and remote"), headers=auth["acme"])
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "echo: sync and remote"
        other = await http.post("/v1/chat/completions", json=chat("globex too"), headers=auth["globex"])
        assert other.status_code == 200
        await asyncio.sleep(1.5)

        own = (await http.get("/v1/usage", headers=auth["acme"])).json()
        assert {(r["tenant"], r["model"], r["route"]) for r in own["data"]} == {
            ("acme", REMOTE_CHAT, "remote")
        }
        assert own["totals"]["completion_tokens"] == answer.json()["usage"]["completion_tokens"]
        everyone = (await http.get("/v1/usage", headers=auth["ops"])).json()
        assert {r["tenant"] for r in everyone["data"]} == {"acme", "globex"}
        one = (await http.get("/v1/usage", params={"tenant": "globex"}, headers=auth["ops"])).json()
        assert {r["tenant"] for r in one["data"]} == {"globex"}
        report = (await http.get("/v1/usage", params={"what_if": "true"}, headers=auth["acme"])).json()
        assert report["what_if"]["cost"] == pytest.approx(own["totals"]["cost"])
        assert report["what_if"]["saved"] == 0 and "what_if" not in own

        forbidden = await http.get("/v1/usage", params={"tenant": "globex"}, headers=auth["acme"])
        assert forbidden.status_code == 403 and forbidden.json()["error"]["type"] == "permission_error"
        bad_day = await http.get("/v1/usage", params={"start": "yesterday"}, headers=auth["acme"])
        assert bad_day.status_code == 400 and bad_day.json()["error"]["param"] == "start"
        backwards = await http.get(
            "/v1/usage", params={"start": "2026-02-02", "end": "2026-02-01"}, headers=auth["acme"]
        )
        assert backwards.status_code == 200 and backwards.json()["data"] == []  # an empty period
        decades = await http.get(
            "/v1/usage", params={"start": "1990-01-01", "end": "2026-02-01"}, headers=auth["acme"]
        )
        assert decades.status_code == 200 and decades.json()["start"] == "2024-12-29"  # its last 400 days
        unknown = await http.post(
            "/v1/chat/completions", json=chat("x", model="gpt-9-imaginary"), headers=auth["acme"]
        )
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def run_cli(*args: str, redis_url: str, prefix: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env = {**clean, "OVERSPILL_REDIS_URL": redis_url, "OVERSPILL_PREFIX": prefix}
    return subprocess.run([str(OVERSPILL), *args], capture_output=True, text=True, timeout=60, env=env)


async def test_the_usage_command_prints_a_table_json_and_a_what_if(
    client: Client, redis_url: str, prefix: str
) -> None:
    """The ledger written by hand (its layout is the contract), read back by the command."""
    day = day_of(__import__("time").time())
    key = Keys(prefix).usage(day)
    fields = {
        "acme\tlocal-model\tlocal\trequests": 10, "acme\tlocal-model\tlocal\titems": 100,
        "acme\tlocal-model\tlocal\tgpu_s": 2.0, "acme\tlocal-model\tlocal\tcost": 0.5,
        "acme\tlocal-model\tlocal\tremote_cost": 1.0, "acme\tlocal-model\tlocal\tsaved": 0.125,
        "acme\tlocal-model\tremote\trequests": 5, "acme\tlocal-model\tremote\titems": 50,
        "acme\tlocal-model\tremote\tcost": 0.75, "acme\tlocal-model\tremote\tremote_cost": 0.75,
        "acme\tonly-remote\tremote\trequests": 1, "acme\tonly-remote\tremote\titems": 1,
        "acme\tonly-remote\tremote\tcost": 0.25, "acme\tonly-remote\tremote\tremote_cost": 0.25,
    }  # fmt: skip
    await client.redis.hset(key, mapping=fields)

    table = run_cli("usage", redis_url=redis_url, prefix=prefix)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:4] == ["day", "tenant", "model", "route"]
    assert len(table.stdout.splitlines()) == 4
    doc = json.loads(run_cli("usage", "--json", "--what-if", redis_url=redis_url, prefix=prefix).stdout)
    assert doc["what_if"] == {
        "cost": 1.5,
        "remote_cost": 1.0,
        "local_cost": 0.5,
        "all_remote_cost": 2.0,
        "local_gpu_s": 2.0,
        "all_local_gpu_s": 3.0,  # 50 more items at 0.02 GPU-s each
        "cannot_be_local": ["only-remote"],
        "saved": 0.125,  # what cost-aware routing kept local would have cost remotely
    }
    text = run_cli("usage", "--what-if", redis_url=redis_url, prefix=prefix).stdout
    assert "all-remote would cost  $2.000000" in text and "cannot run locally: only-remote" in text
    assert "cost-aware routing saved $0.125000" in text
    bad = run_cli("usage", "--start", "soon", redis_url=redis_url, prefix=prefix)
    assert bad.returncode == 1 and json.loads(bad.stderr)["error"]["type"] == "invalid_request"


def test_a_negative_budget_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="monthly_remote_budget"):
        TenantSpec(name="acme", monthly_remote_budget=-1)
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"name": "acme", "monthly_remote_budget": -0.01}]}))
    with pytest.raises(ValueError, match="monthly_remote_budget"):
        load_tenants(path)


async def test_past_its_budget_a_tenant_stops_spilling_and_its_remote_only_jobs_fail(
    client: Client, start_worker: WorkerFactory, fake_remote: FakeRemote, tmp_path: Path
) -> None:
    tenants = tmp_path / "budgets.json"
    # acme's budget is spent by its first two jobs; globex has none
    tenants.write_text(
        json.dumps({"tenants": [{"name": "acme", "monthly_remote_budget": 1e-6}, {"name": "globex"}]})
    )
    doc = {
        "remotes": [
            {
                "name": "a",
                "base_url": fake_remote.base_url,
                "models": {REMOTE_CHAT: "", "fixed-cost": ""},
                "same_models": ["fixed-cost"],
                "prices": {
                    REMOTE_CHAT: {"input_per_1m": 1, "output_per_1m": 1},
                    "fixed-cost": {"input_per_1m": 1},
                },
            }
        ]
    }
    providers = tmp_path / "providers.json"
    providers.write_text(json.dumps(doc))
    models = json.dumps([m.model_dump(mode="json") for m in CATALOGUE])
    start_worker(
        models=models, providers_file=str(providers), tenants_file=str(tenants), gateway_mode="remote"
    )
    embed = {"model": "fixed-cost", "input": "spill me"}

    first = await client.wait_many(
        [
            await client.submit("chat", chat("spend"), tenant="acme"),
            await client.submit("embed", embed, tenant="acme"),
        ],
        timeout=60,
    )
    assert [(r.status, r.route, r.route_reason) for r in first] == [
        ("succeeded", "remote", "remote_only"),
        ("succeeded", "remote", "primary"),
    ]
    await asyncio.sleep(2.5)  # the ledger's flush, then the budgets' refresh

    ids = [
        await client.submit("chat", chat("more"), tenant="acme"),
        await client.submit("embed", {**embed, "input": "stay home"}, tenant="acme"),
        await client.submit("chat", chat("globex has no budget"), tenant="globex"),
    ]
    chat_over, embed_over, other = await client.wait_many(ids, timeout=60)
    assert (chat_over.status, chat_over.error and chat_over.error.type) == ("failed", "budget_exceeded")
    assert chat_over.error is not None and "budget" in chat_over.error.message
    assert (embed_over.status, embed_over.route, embed_over.route_reason) == (
        "succeeded",
        "local",
        "budget_exceeded",
    )
    assert (other.status, other.route) == ("succeeded", "remote")
    assert len(fake_remote.requests()) == 3
