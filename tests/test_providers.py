"""Remote-only models and several remotes: real worker processes, two real fake remotes.

- a remote-only model always goes to a remote (``route_reason: remote_only``), through the
  same queue, and falls back from the first remote to the second when the first is down;
- the remotes' limits are shared by every worker: two worker processes together never send
  more than the configured requests per second, and a 429 holds all of them back;
- bad input: an unknown model, a remote-only model asked to stay local, a providers file that
  does not parse (the worker refuses to start and says why).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer import Client
from stack.processes import free_port
from workers.backends.remote import ProviderLimits, ProvidersFileError, SharedLimiter, load_providers
from workers.core.settings import DEFAULT_MODELS, ModelSpec

from .conftest import WorkerFactory
from .fixtures_remote import FakeRemote, start_fake_remote

REMOTE_CHAT = "gpt-4.1-mini"
REMOTE_EMBED = "text-embedding-3-small"
CATALOGUE = [
    *DEFAULT_MODELS,
    ModelSpec(name=REMOTE_CHAT, kind="chat", remote_only=True),
    ModelSpec(name=REMOTE_EMBED, kind="embed", remote_only=True, dim=1536),
]


@pytest.fixture(scope="module")
def second_remote_server(run_dir: Path) -> Iterator[FakeRemote]:
    remote = start_fake_remote(run_dir, "fake-remote-2")
    yield remote
    remote.process.stop()


@pytest.fixture
def second_remote(second_remote_server: FakeRemote) -> Iterator[FakeRemote]:
    second_remote_server.reset()
    yield second_remote_server
    second_remote_server.reset()


def providers_file(tmp_path: Path, remotes: list[dict[str, Any]]) -> Path:
    path = tmp_path / "providers.json"
    path.write_text(json.dumps({"remotes": remotes}))
    return path


def remote_entry(name: str, remote: FakeRemote, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "base_url": remote.base_url,
        "models": {REMOTE_CHAT: f"{name}/{REMOTE_CHAT}", REMOTE_EMBED: ""},
        "max_retries": 1,
        "timeout_s": 5,
        **extra,
    }


def worker_settings(path: Path, **extra: Any) -> dict[str, Any]:
    models = json.dumps([m.model_dump(mode="json") for m in CATALOGUE])
    return {"models": models, "providers_file": str(path), "remote_backoff_s": 0.05, **extra}


def chat(text: str, model: str = REMOTE_CHAT) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8}


async def test_remote_only_models_always_go_to_the_first_remote(
    client: Client,
    start_worker: WorkerFactory,
    fake_remote: FakeRemote,
    second_remote: FakeRemote,
    tmp_path: Path,
) -> None:
    path = providers_file(tmp_path, [remote_entry("a", fake_remote), remote_entry("b", second_remote)])
    start_worker(**worker_settings(path))

    chats = [await client.submit("chat", chat(f"hello {i}")) for i in range(5)]
    embeds = [await client.submit("embed", {"model": REMOTE_EMBED, "input": ["one two", "three"]})]
    results = await client.wait_many([*chats, *embeds], timeout=60)

    assert [(r.status, r.route, r.route_reason) for r in results] == [
        ("succeeded", "remote", "remote_only")
    ] * 6
    assert (
        results[0].body is not None and results[0].body["choices"][0]["message"]["content"] == "echo: hello 0"
    )
    assert results[0].model == f"a/{REMOTE_CHAT}"  # the remote's own name for the model
    embedding = results[-1].body
    assert (
        embedding is not None
        and len(embedding["data"]) == 2
        and len(embedding["data"][0]["embedding"]) == 1536
    )
    seen = Counter(r["model"] for r in fake_remote.requests())
    assert seen == Counter({f"a/{REMOTE_CHAT}": 5, REMOTE_EMBED: 1})
    assert second_remote.requests() == []


async def test_a_down_remote_falls_back_to_the_next(
    client: Client,
    start_worker: WorkerFactory,
    fake_remote: FakeRemote,
    second_remote: FakeRemote,
    tmp_path: Path,
) -> None:
    fake_remote.control(mode="503")
    path = providers_file(tmp_path, [remote_entry("a", fake_remote), remote_entry("b", second_remote)])
    start_worker(**worker_settings(path))

    ids = [await client.submit("chat", chat(f"fallback {i}")) for i in range(6)]
    results = await client.wait_many(ids, timeout=60)

    assert [(r.status, r.route_reason, r.model) for r in results] == [
        ("succeeded", "remote_only", f"b/{REMOTE_CHAT}")
    ] * 6
    assert len(second_remote.requests()) == 6
    assert {r["status"] for r in fake_remote.requests()} == {503}
    # a's circuit is open now: later jobs go straight to b instead of each paying a's retries
    tried_a = len(fake_remote.requests())
    later = await client.wait_many(
        [await client.submit("chat", chat(f"later {i}")) for i in range(4)], timeout=30
    )
    assert {(r.status, r.model) for r in later} == {("succeeded", f"b/{REMOTE_CHAT}")}
    assert len(fake_remote.requests()) == tried_a


async def test_every_remote_down_the_jobs_wait_then_run(
    client: Client, start_worker: WorkerFactory, fake_remote: FakeRemote, tmp_path: Path
) -> None:
    """A remote-only job has no local fallback: it waits for a remote, it does not fail."""
    fake_remote.control(mode="503")
    start_worker(**worker_settings(providers_file(tmp_path, [remote_entry("a", fake_remote)])))
    job = await client.submit("chat", chat("patience"))
    await asyncio.sleep(2.0)
    assert (await client.get(job)).status in ("queued", "running")
    fake_remote.control(mode="ok")
    result = await client.wait(job, timeout=30)
    assert (result.status, result.route, result.route_reason) == ("succeeded", "remote", "remote_only")


async def test_bad_models_fail_with_a_clear_type(
    client: Client, start_worker: WorkerFactory, fake_remote: FakeRemote, tmp_path: Path
) -> None:
    start_worker(**worker_settings(providers_file(tmp_path, [remote_entry("a", fake_remote)])))
    unknown = await client.submit("chat", chat("hi", model="gpt-9-imaginary"))
    forced_local = await client.submit("chat", chat("hi"), local_only=True)
    a, b = await client.wait_many([unknown, forced_local], timeout=30)

    assert (a.status, a.error and a.error.type) == ("failed", "model_not_found")
    assert (b.status, b.error and b.error.type) == ("failed", "invalid_request")
    assert b.error is not None and "served only by a remote" in b.error.message
    assert fake_remote.requests() == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("remotes: [name: a, base_url", "does not parse"),
        ('{"remotes": [{"name": "a"}]}', "remotes.0.base_url"),
        (
            '{"remotes": [{"name": "a", "base_url": "http://x", "limits": {"requests_per_min": -5}}]}',
            "requests_per_min",
        ),
        (
            '{"remotes": [{"name": "a", "base_url": "http://x", "prices": {"m": {"input_per_1m": "lots"}}}]}',
            "input_per_1m",
        ),
        (
            '{"remotes": [{"name": "a", "base_url": "http://x", "prices": {"m": {"output_per_1m": -0.5}}}]}',
            "remotes.0.prices.m.output_per_1m: Input should be greater than or equal to 0",
        ),
        ('{"local": {"replica_per_hour": -1}}', "local.replica_per_hour"),
    ],
)
def test_a_providers_file_that_does_not_parse_is_refused(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(text)
    with pytest.raises(ProvidersFileError, match=reason):
        load_providers(path)


def test_a_worker_with_a_bad_providers_file_does_not_start(
    start_worker: WorkerFactory, tmp_path: Path
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text("remotes: [name: a, base_url")
    worker = start_worker(providers_file=str(path))
    deadline = time.monotonic() + 30
    while worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker.poll() not in (None, 0)
    assert "does not parse" in worker.log_path.read_text()


# ---------------------------------------------------------------------------- shared limits


def per_second(remote: FakeRemote) -> Counter[int]:
    return Counter(int(r["at"]) for r in remote.requests())


async def test_two_workers_together_keep_to_the_providers_rate(
    client: Client, start_worker: WorkerFactory, fake_remote: FakeRemote, tmp_path: Path
) -> None:
    rate = 5  # requests per second, for both workers together
    limits = {"requests_per_min": rate * 60}
    path = providers_file(tmp_path, [remote_entry("a", fake_remote, limits=limits)])
    start_worker(**worker_settings(path))
    start_worker(**worker_settings(path))
    await asyncio.sleep(1.5)  # both workers polling

    ids = await client.submit_many([("chat", chat(f"storm {i}")) for i in range(40)])
    started = time.time()
    results = await client.wait_many(ids, timeout=60)
    elapsed = time.time() - started

    assert all(r.status == "succeeded" for r in results)
    bins = per_second(fake_remote)
    assert sum(bins.values()) == 40  # not one 429, not one retry
    assert max(bins.values()) <= rate + 1, bins  # + 1: the network may reorder across a boundary
    assert elapsed >= (40 - 1) / rate - 1.0  # the limit was binding: 40 jobs could run at once
    records = fake_remote.requests()
    gaps = [b["at"] - a["at"] for a, b in zip(records, records[1:], strict=False)]
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(1 / rate, abs=0.05)  # evenly spaced


async def test_a_429_holds_every_worker_back_and_cuts_the_shared_rate(
    client: Client,
    start_worker: WorkerFactory,
    fake_remote: FakeRemote,
    tmp_path: Path,
    redis_url: str,
    prefix: str,
) -> None:
    rate = 10
    limits = {"requests_per_min": rate * 60, "recover_s": 30}
    path = providers_file(tmp_path, [remote_entry("a", fake_remote, limits=limits, max_retries=3)])
    start_worker(**worker_settings(path))
    start_worker(**worker_settings(path))
    await asyncio.sleep(1.5)
    fake_remote.control(mode="429", count=1, retry_after="2")

    ids = await client.submit_many([("chat", chat(f"burst {i}")) for i in range(20)])
    results = await client.wait_many(ids, timeout=60)

    assert all(r.status == "succeeded" for r in results)
    records = fake_remote.requests()
    limited = [r for r in records if r["status"] == 429]
    assert len(limited) == 1
    after = [r["at"] for r in records if r["at"] > limited[0]["at"]]
    assert min(after) - limited[0]["at"] >= 1.9  # Retry-After held both workers back
    # The rate was halved (growing back over 30 s): after the hold, gaps are about 1 / (rate / 2).
    gaps = sorted(b - a for a, b in zip(after, after[1:], strict=False))
    assert gaps[len(gaps) // 2] >= 1 / (rate * 0.7)
    async with aioredis.from_url(redis_url) as r:
        state = await r.hgetall(f"{prefix}:v1:provider:a:limits")
    assert float(state[b"factor"]) == pytest.approx(0.5)


async def test_the_shared_rate_grows_back_after_a_429(redis_url: str, prefix: str) -> None:
    limits = ProviderLimits(requests_per_min=600, recover_s=1.0, floor=0.1)
    async with aioredis.from_url(redis_url) as r:
        one, other = SharedLimiter(r, prefix, "p", limits), SharedLimiter(r, prefix, "p", limits)
        assert await one.penalise(0.2) == pytest.approx(0.5)
        assert await other.penalise(0.0) == pytest.approx(0.25, abs=0.01)  # both cut the same rate
        started = time.monotonic()
        await other.acquire(1)  # held by the first Retry-After, whichever worker asks
        assert time.monotonic() - started >= 0.15
        *_, factor = await one._call("release", "none", 0, 0, limits.recover_s, limits.floor)
        assert 0.25 < factor < 1
        await asyncio.sleep(1.0)
        *_, factor = await one._call("release", "none", 0, 0, limits.recover_s, limits.floor)
        assert factor == 1


async def test_prices_are_re_read_when_the_file_changes_and_a_bad_version_keeps_them(
    client: Client, start_worker: WorkerFactory, fake_remote: FakeRemote, tmp_path: Path, prefix: str
) -> None:
    """No restart: the ledger books each job at the prices in force when it settled."""
    from producer.contract import Keys, day_of, read_usage

    from .test_policy import metric

    def write(prices: dict[str, Any]) -> None:
        entry = remote_entry("a", fake_remote, prices={REMOTE_CHAT: prices})
        path.write_text(json.dumps({"remotes": [entry]}))

    async def one(text: str) -> tuple[int, int]:
        result = await client.wait(await client.submit("chat", chat(text)), timeout=30)
        assert result.status == "succeeded" and result.body is not None
        return result.body["usage"]["prompt_tokens"], result.body["usage"]["completion_tokens"]

    async def booked() -> float:
        await asyncio.sleep(1.5)  # the ledger's flush
        rows = await read_usage(client.redis, Keys(prefix), [day_of(time.time())])
        return sum(r.cost for r in rows)

    path = tmp_path / "providers.json"
    write({"input_per_1m": 1.0, "output_per_1m": 2.0})
    port = free_port()
    start_worker(**worker_settings(path, metrics_port=port))
    p1, c1 = await one("first price")
    assert await booked() == pytest.approx((p1 * 1.0 + c1 * 2.0) / 1e6)

    write({"input_per_1m": 10.0, "output_per_1m": 20.0})
    await asyncio.sleep(1.2)  # checked once a second
    p2, c2 = await one("second price")
    expected = (p1 * 1.0 + c1 * 2.0 + p2 * 10.0 + c2 * 20.0) / 1e6
    assert await booked() == pytest.approx(expected)
    assert metric(port, 'overspill_config_file_errors_total{file="prices"}') == 0

    write({"input_per_1m": -10.0})  # refused whole: the prices in force stay
    await asyncio.sleep(1.2)
    p3, c3 = await one("third price")
    assert await booked() == pytest.approx(expected + (p3 * 10.0 + c3 * 20.0) / 1e6)
    assert metric(port, 'overspill_config_file_errors_total{file="prices"}') == 1
    path.write_text("remotes: [name: a, base_url")  # does not parse: the same
    await asyncio.sleep(1.2)
    await one("fourth price")
    assert metric(port, 'overspill_config_file_errors_total{file="prices"}') == 2


def test_a_watched_file_hands_back_each_good_version_once(tmp_path: Path) -> None:
    from prometheus_client import REGISTRY

    from workers.core import WatchedFile

    def errors() -> float:
        return REGISTRY.get_sample_value("overspill_config_file_errors_total", {"file": "unit"}) or 0.0

    path = tmp_path / "providers.json"
    path.write_text('{"local": {"replica_per_hour": 1}}')
    watched = WatchedFile(path, load_providers, "unit", interval_s=0)
    watched.prime()
    assert watched.poll() is None  # the version read at start
    path.write_text('{"local": {"replica_per_hour": 2.5}}')
    new = watched.poll()
    assert new is not None and new.local.replica_per_hour == 2.5
    assert watched.poll() is None
    before = errors()
    path.write_text('{"local": {"replica_per_hour": -2}}')
    assert watched.poll() is None and errors() == before + 1
    path.unlink()
    assert watched.poll() is None and watched.poll() is None
    assert errors() == before + 2  # a missing file is counted once, not once a poll
