"""Webhook limits: one tenant's slow receiver cannot delay another tenant's callbacks, a
receiver gets 5 s to answer, and dead letters are bounded (no copy of a large result, a TTL,
a count per tenant) while replay still sends the exact body.

A worker and an API of their own, with the default delivery slots, tenant cap and timeout;
the session's receiver, which can answer slowly on a path.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from producer import Client
from producer.contract import DeadLetter
from stack.processes import TritonServer
from tests.conftest import worker_env
from tests.fixtures_api import (
    ApiServer,
    Receiver,
    TenantKeys,
    api_with_worker,
    verify_signature,
    wait_delivery_state,
)
from workers.delivery import WebhookSettings

EMBED = {"model": "all-MiniLM-L6-v2", "input": "webhook me"}
DEFAULTS = WebhookSettings()
DEAD_LETTER_MAX = 3
TENANT_CAP = 8  # the default per-tenant cap of deliveries in flight in a worker


@pytest.fixture(scope="module")
def limits_api(
    redis_url: str, triton: TritonServer, run_dir: Path, tenants: TenantKeys, receiver: Receiver
) -> Iterator[ApiServer]:
    prefix = "t-whl-" + secrets.token_hex(3)
    env = worker_env(
        redis_url,
        triton,
        prefix,
        tenants_file=tenants.path,
        webhook_allow_hosts=f"127.0.0.1:{receiver.port}",
        webhook_retry_schedule_s="60",  # a failed attempt stays "retrying" for the whole test
        webhook_dead_letter_max=DEAD_LETTER_MAX,
    )
    with api_with_worker(run_dir, redis_url, prefix, tenants.path, env) as server:
        yield server


@pytest.fixture
async def api(limits_api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=limits_api.url, timeout=60) as client:
        yield client


@pytest.fixture
async def jobs(redis_url: str, limits_api: ApiServer) -> AsyncIterator[Client]:
    async with Client(redis_url, prefix=limits_api.prefix) as client:
        yield client


async def until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------- concurrency


def test_defaults_leave_slots_for_other_tenants() -> None:
    assert DEFAULTS.webhook_timeout_s == 5.0
    assert DEFAULTS.webhook_tenant_max_inflight == TENANT_CAP < DEFAULTS.webhook_max_jobs == 64
    with pytest.raises(ValidationError, match="one tenant cannot take every delivery slot"):
        WebhookSettings(webhook_tenant_max_inflight=64, webhook_max_jobs=64)


async def test_a_slow_tenant_does_not_delay_another_tenants_callbacks(
    jobs: Client, receiver: Receiver
) -> None:
    """globex's receiver takes 3 s per callback and it has 2.5x the worker's delivery slots
    queued; acme's callback still arrives within a second of its job finishing, and globex
    never has more than its cap in flight."""
    slow, fast = receiver.new_path(), receiver.new_path()
    receiver.slow(slow, 3.0)
    try:
        many = [("embed", {**EMBED, "input": f"b{i}"}) for i in range(160)]
        ids = await jobs.submit_many(many, tenant="globex", webhook={"url": receiver.url(slow)})
        await jobs.wait_many(ids, timeout=60)
        await until(lambda: receiver.active.get(slow, 0) >= TENANT_CAP)
        await asyncio.sleep(0.5)  # every globex delivery has been claimed once
        job = await jobs.submit("embed", EMBED, tenant="acme", webhook={"url": receiver.url(fast)})
        (got,) = await receiver.wait_for(fast, 1)
        finished = (await jobs.get(job)).finished_at
        assert finished is not None
        delay = got.at - finished
        assert delay < 1.0, f"acme's callback came {delay:.2f}s after its job finished"
        assert receiver.peak[slow] == TENANT_CAP
    finally:
        receiver.slow(slow, 0)  # globex's backlog drains at once, off the other tests' way


async def test_a_receiver_gets_5s_to_answer(
    api: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
) -> None:
    h, path = tenants.headers("acme"), receiver.new_path()
    receiver.slow(path, 6.5)
    try:
        job = {"kind": "embed", "body": EMBED, "options": {"webhook": {"url": receiver.url(path)}}}
        r = await api.post("/v1/jobs", json=job, headers=h)
        job_id = r.json()["id"]
        state = await wait_delivery_state(api, h, job_id, "retrying", timeout=15)
        assert state["error_type"] == "timeout" and state["error"] == "no answer within 5s"
        finished = (await api.get(f"/v1/jobs/{job_id}", headers=h)).json()["finished_at"]
        assert 4.8 <= float(state["updated_at"]) - finished < 6.0
    finally:
        receiver.slow(path, 0)


# ---------------------------------------------------------------------------- dead letters


async def dead_letter(jobs: Client, tenant: str, webhook_id: str) -> tuple[DeadLetter, int]:
    """A stored dead letter, and how many bytes it takes in Redis."""
    key = jobs.keys.dead_letters(tenant)
    raw = await jobs.redis.hget(key, webhook_id)
    assert raw is not None, f"no dead letter {webhook_id}"
    return DeadLetter.model_validate_json(raw), int(await jobs.redis.hstrlen(key, webhook_id))


async def refused_large_result(
    jobs: Client, api: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver, inputs: int
) -> tuple[str, str, str]:
    """A job with a large result whose callback the receiver refuses (400): job id, path, webhook id."""
    path = receiver.new_path()
    receiver.answer(path, 400)
    body = {**EMBED, "input": [f"text number {i}" for i in range(inputs)]}
    job_id = await jobs.submit("embed", body, tenant="acme", webhook={"url": receiver.url(path)})
    await wait_delivery_state(api, tenants.headers("acme"), job_id, "dead")
    return job_id, path, "msg_" + job_id.removeprefix("job_")


async def test_a_large_result_is_not_copied_into_its_dead_letter_and_replays_exactly(
    jobs: Client, api: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
) -> None:
    job_id, path, webhook_id = await refused_large_result(jobs, api, tenants, receiver, 300)
    (refused,) = receiver.on(path)
    assert len(refused.body) > 1_000_000
    letter, stored = await dead_letter(jobs, "acme", webhook_id)
    assert stored < 4096  # a reference to the job, not a second copy of its result
    assert letter.body_in_job and letter.delivery.body == ""
    h = tenants.headers("acme")
    r = await api.post(f"/v1/webhooks/dead-letters/{webhook_id}/replay", headers=h)
    assert r.status_code == 202, r.text
    _, replayed = await receiver.wait_for(path, 2)
    assert replayed.answered == 200 and replayed.headers["webhook-id"] == webhook_id
    assert replayed.body == refused.body  # the job record's result: the same bytes
    assert verify_signature(tenants.secrets["acme"], replayed.headers, replayed.body)
    await wait_delivery_state(api, h, job_id, "delivered")


async def test_a_dead_letter_whose_job_result_expired_cannot_be_replayed(
    jobs: Client, api: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
) -> None:
    job_id, path, webhook_id = await refused_large_result(jobs, api, tenants, receiver, 60)
    await jobs.redis.delete(jobs.keys.job(job_id))  # as its TTL would
    r = await api.post(f"/v1/webhooks/dead-letters/{webhook_id}/replay", headers=tenants.headers("acme"))
    assert r.status_code == 410 and r.json()["error"]["code"] == "result_expired", r.text
    assert len(receiver.on(path)) == 1


async def test_dead_letters_expire_and_a_tenant_keeps_only_the_newest(
    jobs: Client, api: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
) -> None:
    h, path = tenants.headers("wide"), receiver.new_path()
    receiver.answer(path, *[400] * 5)
    ids = []
    for i in range(DEAD_LETTER_MAX + 2):
        job_id = await jobs.submit("embed", {**EMBED, "input": f"d{i}"}, tenant="wide",
                                       webhook={"url": receiver.url(path)})  # fmt: skip
        await wait_delivery_state(api, h, job_id, "dead")
        ids.append(job_id)
    letters = (await api.get("/v1/webhooks/dead-letters", headers=h)).json()["data"]
    assert [x["delivery"]["job_id"] for x in letters] == ids[::-1][:DEAD_LETTER_MAX]  # newest first
    for x in letters:
        assert not x["body_in_job"] and x["delivery"]["body"]  # small bodies are kept inline
        assert x["expires_at"] == pytest.approx(x["failed_at"] + DEFAULTS.webhook_dead_letter_ttl_s)
    ttl = await jobs.redis.ttl(jobs.keys.dead_letters("wide"))
    assert 0 < ttl <= DEFAULTS.webhook_dead_letter_ttl_s
    dropped = "msg_" + ids[0].removeprefix("job_")
    r = await api.post(f"/v1/webhooks/dead-letters/{dropped}/replay", headers=h)
    assert r.status_code == 404
