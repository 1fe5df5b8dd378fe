"""Remote-only models through every door, and unknown models refused at the door.

Real worker processes, the real API, the fake remote over HTTP, the webhook receiver and the
OpenAI SDK for the Batch API.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stack.processes import ManagedProcess

from .conftest import WorkerFactory
from .fixtures_api import Receiver, TenantKeys, api_url, start_api, verify_signature
from .fixtures_batches import full_lines, jsonl, run_batch, start_batch_api, wait_batch
from .fixtures_remote import FakeRemote
from .test_providers import CATALOGUE, REMOTE_CHAT, chat, providers_file, remote_entry


@pytest.fixture
def stack(
    start_worker: WorkerFactory,
    fake_remote: FakeRemote,
    tmp_path: Path,
    run_dir: Path,
    redis_url: str,
    prefix: str,
    tenants: TenantKeys,
    receiver: Receiver,
) -> Iterator[ManagedProcess]:
    """A worker serving the remote-only catalogue, with webhooks to the receiver; its API."""
    start_worker(
        models=json.dumps([m.model_dump(mode="json") for m in CATALOGUE]),
        providers_file=str(providers_file(tmp_path, [remote_entry("a", fake_remote)])),
        remote_backoff_s=0.05,
        tenants_file=str(tenants.path),
        webhook_allow_hosts=f"127.0.0.1:{receiver.port}",
    )
    api = start_batch_api(run_dir, redis_url, prefix, tenants.path)
    yield api
    api.stop()


async def test_a_remote_only_job_calls_its_webhook_back(
    stack: ManagedProcess, tenants: TenantKeys, receiver: Receiver, fake_remote: FakeRemote
) -> None:
    path = receiver.new_path()
    job = {"kind": "chat", "body": chat("call me back"), "options": {"webhook": {"url": receiver.url(path)}}}
    async with httpx.AsyncClient(base_url=api_url(stack), timeout=30) as http:
        accepted = await http.post("/v1/jobs", json=job, headers=tenants.headers("acme"))
        assert accepted.status_code == 202, accepted.text
        (got,) = await receiver.wait_for(path, 1)
    assert verify_signature(tenants.secrets["acme"], got.headers, got.body)
    envelope = got.json()
    assert envelope["id"] == accepted.json()["id"]
    assert (envelope["status"], envelope["route"], envelope["route_reason"]) == (
        "succeeded",
        "remote",
        "remote_only",
    )
    assert envelope["body"]["choices"][0]["message"]["content"] == "echo: call me back"
    assert [r["model"] for r in fake_remote.requests()] == [f"a/{REMOTE_CHAT}"]


async def test_a_remote_only_batch_runs_through_the_batch_api(
    stack: ManagedProcess, tenants: TenantKeys, fake_remote: FakeRemote
) -> None:
    import openai

    lines = [
        {"custom_id": f"c-{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat(f"night {i}")}
        for i in range(12)
    ]
    lines.append(
        {"custom_id": "nope", "method": "POST", "url": "/v1/chat/completions", "body": chat("x", "gpt-9")}
    )
    async with openai.AsyncOpenAI(
        base_url=f"{api_url(stack)}/v1", api_key=tenants.keys["acme"], max_retries=0, timeout=60
    ) as sdk:
        batch = await run_batch(sdk, jsonl(lines), endpoint="/v1/chat/completions")
        done = await wait_batch(sdk, batch.id)
        assert done.status == "completed", done
        output = await full_lines(sdk, done.output_file_id)
        errors = await full_lines(sdk, done.error_file_id)
    by_id = {line["custom_id"]: line for line in output}
    assert set(by_id) == {f"c-{i}" for i in range(12)}
    for i in range(12):
        response = by_id[f"c-{i}"]["response"]
        assert response["status_code"] == 200
        assert response["body"]["choices"][0]["message"]["content"] == f"echo: night {i}"
    assert len(fake_remote.requests()) == 12
    (missing,) = errors  # the same error the sync API answers with
    assert missing["custom_id"] == "nope" and missing["response"]["status_code"] == 404
    assert missing["response"]["body"]["error"]["type"] == "not_found_error"
    assert missing["response"]["body"]["error"]["code"] == "model_not_found"


async def test_an_unknown_model_is_refused_before_it_is_queued(
    stack: ManagedProcess, tenants: TenantKeys, prefix: str, client: object
) -> None:
    from producer import Client

    assert isinstance(client, Client)
    h = tenants.headers("acme")
    async with httpx.AsyncClient(base_url=api_url(stack), timeout=30) as http:
        for _ in range(300):  # the worker publishes its catalogue as it starts
            if (await http.get("/v1/models", headers=h)).json()["data"]:
                break
            await asyncio.sleep(0.1)
        keys_before = set(await client.redis.keys(f"{client.keys.root}:*"))  # fmt: skip
        job = await http.post(
            "/v1/jobs", json={"kind": "chat", "body": chat("hi", "gpt-9-imaginary")}, headers=h
        )
        sync = await http.post("/v1/chat/completions", json=chat("hi", "gpt-9-imaginary"), headers=h)
        wrong_kind = await http.post("/v1/embeddings", json={"model": REMOTE_CHAT, "input": "x"}, headers=h)
        jobs_after = {k for k in await client.redis.keys(f"{client.keys.root}:*") if ":job:" in k}
        alias = await http.post(
            "/v1/embeddings",
            json={"model": "sentence-transformers/all-MiniLM-L6-v2", "input": "an alias is known"},
            headers=h,
        )
    for answer in (job, sync, wrong_kind):
        assert answer.status_code == 404, answer.text
        error = answer.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "not_found_error",
            "model_not_found",
            "model",
        )
    assert "gpt-9-imaginary" in job.json()["error"]["message"]
    assert alias.status_code == 200, alias.text
    assert jobs_after == {k for k in keys_before if ":job:" in k}  # nothing written for them


async def test_the_first_catalogue_counts_at_once_even_just_after_an_empty_read(
    redis_url: str, prefix: str
) -> None:
    """A worker may publish a moment after the API read an empty catalogue: the next request
    is checked against what it published, not accepted on the empty copy."""
    import time

    from producer.api.known_models import KnownModels
    from producer.contract import JobKind, Keys, ModelCard, publish_models
    from producer.contract.redis import connect
    from producer.errors import NotFound

    redis, keys = connect(redis_url), Keys(prefix)
    try:
        known = KnownModels(redis, keys)
        await known.refresh()  # empty: no worker yet
        card = ModelCard(id=REMOTE_CHAT, created=int(time.time()), kind=JobKind.chat, served=["remote"])
        await publish_models(redis, keys, [card])
        with pytest.raises(NotFound):
            await known.check(JobKind.chat, chat("hi", "gpt-9-imaginary"))
        await known.check(JobKind.chat, chat("hi"))  # the published model is served
    finally:
        await redis.delete(keys.models())
        await redis.aclose()


async def test_before_any_worker_published_every_model_is_accepted(
    run_dir: Path, redis_url: str, tenants: TenantKeys
) -> None:
    prefix = "t-nocat-" + secrets.token_hex(3)
    api = start_api(run_dir, redis_url, prefix, tenants.path)
    try:
        async with httpx.AsyncClient(base_url=api_url(api), timeout=30) as http:
            job = {"kind": "chat", "body": chat("hi", "gpt-9-imaginary")}
            accepted = await http.post("/v1/jobs", json=job, headers=tenants.headers("acme"))
        assert accepted.status_code == 202, accepted.text
    finally:
        api.stop()
