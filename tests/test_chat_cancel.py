"""Cancelling a chat job a worker holds stops its generation and frees its decode slot.

Real worker, real Triton (SmolLM2 on llama.cpp, 8 slots): a long greedy completion is cancelled
while it generates, through the client, the HTTP API (streamed and not) and the CLI.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import httpx

from producer import Client
from producer.contract import Status
from tests.conftest import Triton, WorkerFactory
from tests.fixtures_api import ApiServer, TenantKeys

CHAT = "SmolLM2-135M-Instruct"


def long_chat(question: str = "Tell a very long story about the sea.", **extra: object) -> dict[str, object]:
    return {"model": CHAT, "messages": [{"role": "user", "content": question}], "max_tokens": 400, "temperature": 0, **extra}  # fmt: skip


def busy_slots(triton: Triton) -> float:
    with urllib.request.urlopen(triton.metrics_url, timeout=2) as r:  # noqa: S310  # loopback
        for line in r.read().decode().splitlines():
            if line.startswith('chat_busy_slots{model="chat"}'):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("the chat model reports no chat_busy_slots")


async def until_running(client: Client, job_id: str, tenant: str = "default", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (await client.get(job_id, tenant=tenant)).status != Status.running:
        assert time.monotonic() < deadline, "the job never started"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # into its generation


async def slots_free(triton: Triton, timeout: float = 5.0) -> float:
    started = time.monotonic()
    while busy_slots(triton) > 0:
        assert time.monotonic() - started < timeout, "the cancelled conversation kept its slot"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_cancelling_a_running_chat_job_stops_it_and_frees_its_slot(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    start_worker()
    job_id = await client.submit("chat", long_chat())
    await until_running(client, job_id)
    started = time.monotonic()
    result = await client.cancel(job_id, settle_s=5.0)
    took = time.monotonic() - started
    assert result.status == Status.cancelled and result.error is not None and result.error.type == "cancelled"
    assert took < 3.0, took  # 400 tokens would take far longer on these cores
    await slots_free(triton)
    again = await client.get(job_id)
    assert again.status == Status.cancelled  # one terminal state, kept


async def test_cancelling_a_bulk_chat_job_stops_it_and_leaves_its_chunk_mates_running(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    start_worker()
    short = {"model": CHAT, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}  # fmt: skip
    ids = await client.submit_many([("chat", long_chat()), ("chat", short)], lane="bulk")
    await until_running(client, ids[0])
    result = await client.cancel(ids[0], settle_s=5.0)
    assert result.status == Status.cancelled and result.error is not None and result.error.type == "cancelled"
    await slots_free(triton)
    mate = await client.wait(ids[1], timeout=60)
    assert mate.status == Status.succeeded and mate.body["choices"][0]["message"]["content"]
    assert (await client.get(ids[0])).status == Status.cancelled


async def test_the_api_cancels_running_chat_jobs_streamed_or_not(
    api_stack: ApiServer, tenants: TenantKeys, triton: Triton
) -> None:
    h = tenants.headers("acme")
    async with httpx.AsyncClient(base_url=api_stack.url, headers=h, timeout=60) as http:
        plain = (await http.post("/v1/jobs", json={"kind": "chat", "body": long_chat()})).json()["id"]
        streamed = await http.post("/v1/jobs", json={"kind": "chat", "body": long_chat("Describe a forest at length."), "options": {"stream": True}})  # fmt: skip
        ids = [plain, streamed.json()["id"]]
        async with Client(_redis_of(api_stack), prefix=api_stack.prefix) as client:
            for job_id in ids:
                await until_running(client, job_id, tenant="acme")
        for job_id in ids:
            answer = await http.delete(f"/v1/jobs/{job_id}")
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "cancelled"
    await slots_free(triton)


def _redis_of(api: ApiServer) -> str:
    assert api.process.env is not None
    return api.process.env["OVERSPILL_REDIS_URL"]


async def test_a_finished_chat_job_is_not_cancelled(client: Client, start_worker: WorkerFactory) -> None:
    start_worker()
    job_id = await client.submit("chat", {**long_chat(), "max_tokens": 2})
    done = await client.wait(job_id, 60)
    assert done.status == Status.succeeded
    result = await client.cancel(job_id, settle_s=1.0)
    assert result.status == Status.succeeded and json.dumps(result.body)  # untouched
