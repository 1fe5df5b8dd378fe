"""Webhook callbacks through a real worker and receiver: signed delivery, retries after 5xx,
429 and a receiver that is down, no second delivery after a 2xx, 4xx and 410 handling, dead
letters and replay, the SSRF guard refusing internal and redirected URLs, and URLs shown
without their credentials or tokens. Signing and the guard as functions: test_webhook_guard.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from producer import Client
from producer.api.deadletters import list_dead_letters
from producer.contract import Keys
from stack.processes import TritonServer
from tests.fixtures_api import (
    ApiServer,
    Receiver,
    TenantKeys,
    verify_signature,
    wait_delivery_state,
)

EMBED = {"model": "all-MiniLM-L6-v2", "input": "webhook me"}

# ---------------------------------------------------------------------------- delivery


async def submit(http: httpx.AsyncClient, headers: dict[str, str], url: str, body: Any = None) -> str:
    job = {"kind": "embed", "body": body or EMBED, "options": {"webhook": {"url": url}}}
    r = await http.post("/v1/jobs", json=job, headers=headers)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


class TestDelivery:
    async def test_signed_once_with_rotating_secrets(
        self, http: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        h, path = tenants.headers("acme"), receiver.new_path()
        job_id = await submit(http, h, receiver.url(path))
        (got,) = await receiver.wait_for(path, 1)
        assert verify_signature(tenants.secrets["acme"], got.headers, got.body) == set(
            tenants.secrets["acme"]
        )
        assert got.headers["webhook-id"] == "msg_" + job_id.removeprefix("job_")
        envelope = (await http.get(f"/v1/jobs/{job_id}", headers=h)).json()
        assert got.json() == envelope and envelope["status"] == "succeeded"
        state = await wait_delivery_state(http, h, job_id, "delivered")
        assert state["attempts"] == "1"
        await asyncio.sleep(1.5)
        assert len(receiver.on(path)) == 1  # nothing twice after a 2xx

    async def test_packed_jobs_are_called_back_like_single_ones(
        self, redis_url: str, api_stack: ApiServer, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        """Twelve jobs in one work package: each gets its own signed callback, once, with its own
        envelope, exactly as a job that travelled alone."""
        path = receiver.new_path()
        webhook = {"url": receiver.url(path)}
        async with (
            Client(redis_url, prefix=api_stack.prefix, coalesce_window_ms=200) as packed,
            Client(redis_url, prefix=api_stack.prefix, coalesce_window_ms=None) as single,
        ):
            ids = await asyncio.gather(
                *(packed.submit("embed", {**EMBED, "input": f"p{i}"}, tenant="acme", webhook=webhook)
                  for i in range(12))
            )  # fmt: skip
            alone = await single.submit("embed", {**EMBED, "input": "p0"}, tenant="acme", webhook=webhook)
            got = await receiver.wait_for(path, 13)
            envelopes = {i: await packed.get(i) for i in [*ids, alone]}
        by_id = {d.headers["webhook-id"]: d for d in got}
        assert len(got) == 13 and len(by_id) == 13  # one callback per job, none twice
        for job_id, envelope in envelopes.items():
            delivery = by_id["msg_" + job_id.removeprefix("job_")]
            assert verify_signature(tenants.secrets["acme"], delivery.headers, delivery.body)
            assert delivery.json() == envelope.model_dump(mode="json", exclude_none=True)
        fields = {"status", "kind", "route", "model", "body", "tenant"}
        assert envelopes[ids[0]].model_dump(include=fields) == envelopes[alone].model_dump(include=fields)

    async def test_failed_job_is_called_back_too(
        self, http: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        h, path = tenants.headers("globex"), receiver.new_path()
        # fixed_cost fails the text __poison__ (an unknown model is refused before it is queued)
        await submit(http, h, receiver.url(path), {"model": "fixed-cost", "input": "__poison__"})
        (got,) = await receiver.wait_for(path, 1)
        assert got.json()["status"] == "failed" and got.json()["error"]["type"] == "model_error"
        assert verify_signature(tenants.secrets["globex"], got.headers, got.body)
        assert not verify_signature(tenants.secrets["acme"], got.headers, got.body)

    async def test_retries_after_5xx_with_same_id(
        self, http: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        h, path = tenants.headers("acme"), receiver.new_path()
        receiver.answer(path, 500, 503)
        job_id = await submit(http, h, receiver.url(path))
        got = await receiver.wait_for(path, 3)
        assert [g.answered for g in got] == [500, 503, 200]
        assert {g.headers["webhook-id"] for g in got} == {"msg_" + job_id.removeprefix("job_")}
        assert all(verify_signature(tenants.secrets["acme"], g.headers, g.body) for g in got)
        assert len({g.body for g in got}) == 1
        assert got[1].at - got[0].at >= 0.4  # the schedule's first wait
        await wait_delivery_state(http, h, job_id, "delivered")
        await asyncio.sleep(1.5)
        assert len(receiver.on(path)) == 3

    async def test_retries_while_receiver_is_down(
        self, http: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        h, path = tenants.headers("acme"), receiver.new_path()
        receiver.down()
        try:
            job_id = await submit(http, h, receiver.url(path))
            state = await wait_delivery_state(http, h, job_id, "retrying")
            assert state["error_type"] == "network_error"
        finally:
            receiver.up()
        (got,) = await receiver.wait_for(path, 1)
        assert got.headers["webhook-id"] == "msg_" + job_id.removeprefix("job_")
        state = await wait_delivery_state(http, h, job_id, "delivered")
        assert int(state["attempts"]) >= 2

    async def test_429_honours_retry_after(
        self, http: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        h, path = tenants.headers("acme"), receiver.new_path()
        receiver.answer(path, (429, {"Retry-After": "2"}))
        await submit(http, h, receiver.url(path))
        first, second = await receiver.wait_for(path, 2)
        assert second.at - first.at >= 1.8  # not the schedule's 0.5 s

    async def test_4xx_dead_letter_then_replay(
        self, http: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        h, path = tenants.headers("acme"), receiver.new_path()
        receiver.answer(path, 400)
        job_id = await submit(http, h, receiver.url(path))
        state = await wait_delivery_state(http, h, job_id, "dead")
        assert state["error_type"] == "http_error" and "400" in state["error"]
        await asyncio.sleep(1.0)
        assert len(receiver.on(path)) == 1  # 4xx: not retried
        letters = (await http.get("/v1/webhooks/dead-letters", headers=h)).json()["data"]
        (letter,) = [x for x in letters if x["delivery"]["job_id"] == job_id]
        assert letter["status_code"] == 400 and letter["attempts"] == 1
        webhook_id = letter["delivery"]["webhook_id"]
        other = await http.post(
            f"/v1/webhooks/dead-letters/{webhook_id}/replay", headers=tenants.headers("globex")
        )
        assert other.status_code == 404  # another tenant's dead letter
        r = await http.post(f"/v1/webhooks/dead-letters/{webhook_id}/replay", headers=h)
        assert r.status_code == 202, r.text
        _, replayed = await receiver.wait_for(path, 2)
        assert replayed.headers["webhook-id"] == webhook_id and replayed.answered == 200
        await wait_delivery_state(http, h, job_id, "delivered")
        again = await http.post(f"/v1/webhooks/dead-letters/{webhook_id}/replay", headers=h)
        assert again.status_code == 404

    async def test_410_disables_the_endpoint(
        self, http: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        h, path = tenants.headers("acme"), receiver.new_path()
        receiver.answer(path, 410)
        first = await submit(http, h, receiver.url(path))
        assert (await wait_delivery_state(http, h, first, "dead"))["error_type"] == "endpoint_gone"
        second = await submit(http, h, receiver.url(path))
        state = await wait_delivery_state(http, h, second, "dead")
        assert state["error_type"] == "endpoint_disabled"
        assert len(receiver.on(path)) == 1  # the second was never sent

    async def test_retries_exhausted(
        self, http: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        h, path = tenants.headers("acme"), receiver.new_path()
        receiver.answer(path, *[500] * 20)
        job_id = await submit(http, h, receiver.url(path))
        state = await wait_delivery_state(http, h, job_id, "dead", timeout=30)
        assert state["error_type"] == "retries_exhausted"
        assert len(receiver.on(path)) == 6  # the first attempt and five retries

    async def test_redirects_to_internal_addresses_refused(
        self, http: httpx.AsyncClient, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        h = tenants.headers("acme")
        for location, words in [
            ("http://169.254.169.254/latest/meta-data/", "link-local"),
            ("http://10.0.0.1/admin", "private"),
        ]:
            path = receiver.new_path()
            receiver.answer(path, (302, {"Location": location}))
            job_id = await submit(http, h, receiver.url(path))
            state = await wait_delivery_state(http, h, job_id, "dead")
            assert state["error_type"] == "url_refused" and words in state["error"], state
            assert (await http.get(f"/v1/jobs/{job_id}", headers=h)).json()["status"] == "succeeded"
            assert len(receiver.on(path)) == 1

    async def test_the_allowlisted_host_admits_no_other_port(
        self, http: httpx.AsyncClient, tenants: TenantKeys, redis_url: str, triton: TritonServer
    ) -> None:
        """127.0.0.1 is allowlisted for the receiver's port only: Redis and Triton on the same
        address are never called."""
        h = tenants.headers("acme")
        for port in (httpx.URL(redis_url).port, httpx.URL(triton.http_url).port):
            job_id = await submit(http, h, f"http://127.0.0.1:{port}/hook")
            state = await wait_delivery_state(http, h, job_id, "dead")
            assert state["error_type"] == "url_refused", state
            assert f"not {port}" in state["error"] and state["attempts"] == "1"

    async def test_credentials_and_tokens_in_urls_are_never_shown(
        self, http: httpx.AsyncClient, api_stack: ApiServer, tenants: TenantKeys, receiver: Receiver
    ) -> None:
        """A URL's password and query values stay out of the delivery state, the dead letters
        and the logs; the receiver still gets the URL as given."""
        h, path = tenants.headers("acme"), receiver.new_path()
        with_password = f"http://hookuser:pw-s3cr3t@127.0.0.1:{receiver.port}{path}?token=tok-s3cr3t"
        refused = await submit(http, h, with_password)
        state = await wait_delivery_state(http, h, refused, "dead")
        assert state["error_type"] == "url_refused" and "credentials" in state["error"]
        assert state["url"] == f"http://***@127.0.0.1:{receiver.port}{path}?token=***"
        with_token = f"{receiver.url(path)}?token=tok2-s3cr3t&v=2"
        delivered = await submit(http, h, with_token)
        (got,) = await receiver.wait_for(f"{path}?token=tok2-s3cr3t&v=2", 1)
        state = await wait_delivery_state(http, h, delivered, "delivered")
        assert state["url"] == f"{receiver.url(path)}?token=***&v=***"
        letters = (await http.get("/v1/webhooks/dead-letters", headers=h)).text
        assert refused in letters
        await asyncio.sleep(0.5)  # the worker's last log lines
        for shown in (letters, api_stack.log_text()):
            assert "s3cr3t" not in shown


async def test_guard_refuses_internal_urls_without_allowlist(
    start_worker: Any, client: Client, prefix: str, receiver: Receiver
) -> None:
    """A worker with no allowlist: loopback, private and metadata URLs are never called."""
    worker = start_worker()
    path = receiver.new_path()
    urls = [receiver.url(path), "http://10.0.0.1/hook", "http://169.254.169.254/latest/meta-data/",
            f"http://localhost:{receiver.port}{path}"]  # fmt: skip
    ids = [await client.submit("embed", EMBED, webhook={"url": u}) for u in urls]
    results = await client.wait_many(ids, timeout=30)
    assert all(r.status.value == "succeeded" for r in results)  # the job result stays as it is
    keys = Keys(prefix)
    deadline = time.monotonic() + 20
    letters: dict[str, Any] = {}
    while time.monotonic() < deadline and len(letters) < len(ids):
        letters = {d.delivery.job_id: d for d in await list_dead_letters(client.redis, keys, "default")}
        await asyncio.sleep(0.1)
    assert set(letters) == set(ids)
    for job_id, url in zip(ids, urls, strict=True):
        assert letters[job_id].error.type == "url_refused", url
        assert "refused" in letters[job_id].error.message
        assert letters[job_id].attempts == 1
    assert receiver.on(path) == []
    assert "webhook URL refused" in worker.log_path.read_text()
