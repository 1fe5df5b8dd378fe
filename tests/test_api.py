"""The HTTP API as a real uvicorn process: jobs, long-poll, cancel, idempotency, the
OpenAI-compatible endpoints through the real ``openai`` SDK, ops endpoints, and bad input.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from producer.contract import LUA_START, Keys
from stack.processes import free_port, python_process
from stack.stack import Stack, StackSettings
from tests.fixtures_api import ApiServer, TenantKeys

EMBED = {"model": "all-MiniLM-L6-v2", "input": "the quick brown fox"}
CHAT = {
    "model": "SmolLM2-135M-Instruct",
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 8,
}


def sdk(api: ApiServer, tenants: TenantKeys, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{api.url}/v1", api_key=tenants.keys[tenant], max_retries=0, timeout=60
    )


def assert_error_shape(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"]
    if code is not None:
        assert err["code"] == code, err
    return dict(err)


class TestOpenAISDK:
    async def test_embeddings_base64_default_and_float(
        self, api_stack: ApiServer, tenants: TenantKeys
    ) -> None:
        """The SDK asks for base64 by default and decodes it; float works as well."""
        async with sdk(api_stack, tenants) as client:
            default = await client.embeddings.create(model="all-MiniLM-L6-v2", input=["hello", "world"])
            floats = await client.embeddings.create(
                model="all-MiniLM-L6-v2", input=["hello", "world"], encoding_format="float"
            )
        assert [d.index for d in default.data] == [0, 1]
        assert len(default.data[0].embedding) == 384
        assert default.usage.prompt_tokens > 0
        for a, b in zip(default.data, floats.data, strict=True):
            assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding, strict=True)) < 1e-6

    async def test_chat_completion(self, api_stack: ApiServer, tenants: TenantKeys) -> None:
        async with sdk(api_stack, tenants) as client:
            reply = await client.chat.completions.create(
                model="SmolLM2-135M-Instruct",
                messages=[{"role": "user", "content": "Name a colour."}],
                max_tokens=8,
                temperature=0,
            )
        assert reply.object == "chat.completion"
        assert isinstance(reply.choices[0].message.content, str)
        assert 0 < reply.usage.completion_tokens <= 8

    async def test_sdk_errors_are_openai_errors(self, api_stack: ApiServer, tenants: TenantKeys) -> None:
        async with sdk(api_stack, tenants) as client:
            with pytest.raises(openai.NotFoundError) as missing:
                await client.embeddings.create(model="no-such-model", input="x", encoding_format="float")
            with pytest.raises(openai.BadRequestError) as bad:
                await client.embeddings.create(model="all-MiniLM-L6-v2", input=[], encoding_format="float")
        assert missing.value.code == "model_not_found"
        assert bad.value.type == "invalid_request_error"
        async with openai.AsyncOpenAI(
            base_url=f"{api_stack.url}/v1", api_key="wrong", max_retries=0
        ) as client:
            with pytest.raises(openai.AuthenticationError):
                await client.embeddings.create(model="all-MiniLM-L6-v2", input="x")

    async def test_rerank(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        body = {"model": "rerank", "query": "fruit", "documents": ["apples and pears", "tax law"], "top_n": 2}
        r = await http.post("/v1/rerank", json=body, headers=tenants.headers("acme"))
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert {x["index"] for x in results} == {0, 1}
        assert results[0]["index"] == 0


class TestJobs:
    async def test_submit_then_long_poll(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        h = tenants.headers("acme")
        r = await http.post("/v1/jobs", json={"kind": "embed", "body": EMBED}, headers=h)
        assert r.status_code == 202, r.text
        accepted = r.json()
        assert accepted["id"].startswith("job_") and accepted["status"] in ("queued", "running")
        assert abs(accepted["created_at"] - time.time()) < 30
        r = await http.get(f"/v1/jobs/{accepted['id']}", params={"wait": 20}, headers=h)
        assert r.status_code == 200
        envelope = r.json()
        assert envelope["status"] == "succeeded" and envelope["tenant"] == "acme"
        assert len(envelope["body"]["data"][0]["embedding"]) == 384

    async def test_long_poll_blocks_then_returns_queued(
        self, idle_api: ApiServer, tenants: TenantKeys
    ) -> None:
        """No worker serves this prefix: ``?wait=1`` holds about a second, then answers as it is."""
        h = tenants.headers("globex")
        async with httpx.AsyncClient(base_url=idle_api.url, timeout=30) as http:
            job_id = (await http.post("/v1/jobs", json={"kind": "embed", "body": EMBED}, headers=h)).json()[
                "id"
            ]
            started = time.monotonic()
            r = await http.get(f"/v1/jobs/{job_id}", params={"wait": 1}, headers=h)
            elapsed = time.monotonic() - started
        assert r.status_code == 200 and r.json()["status"] == "queued"
        assert 0.8 < elapsed < 5

    async def test_long_poll_wakes_when_done(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        h = tenants.headers("acme")
        job_id = (await http.post("/v1/jobs", json={"kind": "chat", "body": CHAT}, headers=h)).json()["id"]
        started = time.monotonic()
        r = await http.get(f"/v1/jobs/{job_id}", params={"wait": 25}, headers=h)
        assert r.json()["status"] == "succeeded"
        assert time.monotonic() - started < 20  # it returned when the job did, not at the limit

    async def test_cancel_queued_and_running(
        self, idle_api: ApiServer, tenants: TenantKeys, redis_url: str
    ) -> None:
        h = tenants.headers("globex")
        async with httpx.AsyncClient(base_url=idle_api.url, timeout=30) as http:
            queued = (await http.post("/v1/jobs", json={"kind": "embed", "body": EMBED}, headers=h)).json()[
                "id"
            ]
            r = await http.delete(f"/v1/jobs/{queued}", headers=h)
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
            assert (await http.get(f"/v1/jobs/{queued}", headers=h)).json()["status"] == "cancelled"

            running = (await http.post("/v1/jobs", json={"kind": "embed", "body": EMBED}, headers=h)).json()[
                "id"
            ]
            await mark_running(redis_url, idle_api.prefix, running)
            r = await http.delete(f"/v1/jobs/{running}", headers=h)
            err = assert_error_shape(r, 409, "job_running")
            assert "running" in err["message"]

    async def test_idempotency_key(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        acme, globex = tenants.headers("acme"), tenants.headers("globex")
        job = {"kind": "embed", "body": EMBED}
        first = await http.post("/v1/jobs", json=job, headers={**acme, "Idempotency-Key": "order-17"})
        again = await http.post("/v1/jobs", json=job, headers={**acme, "Idempotency-Key": "order-17"})
        other = await http.post("/v1/jobs", json=job, headers={**globex, "Idempotency-Key": "order-17"})
        in_options = {**job, "options": {"idempotency_key": "order-17"}}
        via_options = await http.post("/v1/jobs", json=in_options, headers=acme)
        assert first.json()["id"] == again.json()["id"] == via_options.json()["id"]
        assert other.json()["id"] != first.json()["id"]
        fresh = await http.post("/v1/jobs", json=job, headers={**acme, "Idempotency-Key": "order-18"})
        assert fresh.json()["id"] != first.json()["id"]
        # The same key for another request is refused, never answered with the first one's job.
        changed = {"kind": "embed", "body": {**EMBED, "input": "another text"}}
        reused = await http.post("/v1/jobs", json=changed, headers={**acme, "Idempotency-Key": "order-17"})
        err = assert_error_shape(reused, 409, "idempotency_key_reused")
        assert err["param"] == "Idempotency-Key" and first.json()["id"] in err["message"]


async def mark_running(redis_url: str, prefix: str, job_id: str) -> None:
    """Move a job to running with the contract's own start script, as a worker picking it up does."""
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    try:
        assert await r.eval(LUA_START, 1, Keys(prefix).job(job_id)) == [1]
    finally:
        await r.aclose()


class TestOps:
    async def test_health_ready_metrics_docs(self, http: httpx.AsyncClient) -> None:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        assert (await http.get("/readyz")).json() == {"status": "ready"}
        metrics = (await http.get("/metrics")).text
        assert "overspill_api_requests_total" in metrics
        spec = (await http.get("/openapi.json")).json()
        assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/embeddings", "/v1/chat/completions"} <= set(
            spec["paths"]
        )
        # The OpenAI routes are described from the contract's request models.
        body = spec["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": "#/components/schemas/EmbeddingRequest"}
        assert "encoding_format" in spec["components"]["schemas"]["EmbeddingRequest"]["properties"]
        assert (await http.get("/docs")).status_code == 200

    async def test_the_schema_does_not_offer_what_the_server_refuses(
        self, http: httpx.AsyncClient, tenants: TenantKeys
    ) -> None:
        """The tenant comes from the API key: ``options.tenant`` is not in the schema, and a
        request naming another tenant is refused, naming the field."""
        options = (await http.get("/openapi.json")).json()["components"]["schemas"]["ApiJobOptions"]
        assert "tenant" not in options["properties"] and options["additionalProperties"] is False
        job = {"kind": "embed", "body": {"model": "fixed-cost", "input": "x"}, "options": {"tenant": "other"}}
        r = await http.post("/v1/jobs", json=job, headers=tenants.headers("acme"))
        assert r.status_code == 400 and r.json()["error"]["param"] == "options.tenant"


class TestBadRequests:
    """Every bad request is a 4xx with the OpenAI error shape; none is a 5xx."""

    async def test_bad_submissions(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        h = tenants.headers("acme")
        cases: list[tuple[str, dict[str, Any], int]] = [
            ("unknown kind", {"kind": "paint", "body": EMBED}, 400),
            ("body not an object", {"kind": "embed", "body": ["x"]}, 400),
            ("wrong body", {"kind": "embed", "body": {"model": "m"}}, 400),
            ("empty input", {"kind": "embed", "body": {"model": "m", "input": []}}, 400),
            ("unknown option", {"kind": "embed", "body": EMBED, "options": {"colour": "red"}}, 400),
            ("bad lane", {"kind": "embed", "body": EMBED, "options": {"lane": "fast"}}, 400),
            ("other tenant", {"kind": "embed", "body": EMBED, "options": {"tenant": "globex"}}, 400),
            ("missing kind", {"body": EMBED}, 400),
            (
                "ftp webhook",
                {"kind": "embed", "body": EMBED, "options": {"webhook": {"url": "ftp://x/"}}},
                400,
            ),
            ("stream with n > 1", {"kind": "chat", "body": {**CHAT, "stream": True, "n": 2}}, 400),
            ("stream of an embedding", {"kind": "embed", "body": EMBED, "options": {"stream": True}}, 400),
            ("too many tokens", {"kind": "chat", "body": {**CHAT, "max_tokens": 100000}}, 400),
        ]
        for name, payload, status in cases:
            r = await http.post("/v1/jobs", json=payload, headers=h)
            err = assert_error_shape(r, status)
            assert err["type"] == "invalid_request_error", (name, err)

    async def test_bad_transport(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        h = {**tenants.headers("acme"), "content-type": "application/json"}
        err = assert_error_shape(await http.post("/v1/jobs", content=b'{"kind": "embed", ', headers=h), 400)
        assert "JSON" in err["message"]
        assert_error_shape(await http.post("/v1/jobs", content=b"", headers=h), 400)
        huge = json.dumps({"kind": "embed", "body": {"model": "m", "input": "x" * 1_000_000}}).encode()
        assert_error_shape(await http.post("/v1/jobs", content=huge, headers=h), 413, "request_too_large")
        assert_error_shape(await http.post("/v1/embeddings", content=huge, headers=h), 413)
        assert_error_shape(await http.get("/v1/nothing", headers=h), 404)
        assert_error_shape(await http.put("/v1/jobs", headers=h), 405)
        assert_error_shape(await http.get("/v1/jobs/job_nope", headers=h), 404, "job_not_found")
        assert_error_shape(await http.get("/v1/jobs/job_nope", params={"wait": -1}, headers=h), 400)
        assert_error_shape(await http.post("/v1/embeddings", json=[1, 2], headers=h), 400)
        assert_error_shape(await http.post("/v1/chat/completions", json={"model": "x"}, headers=h), 400)

    async def test_a_405_names_every_method_the_path_serves(
        self, http: httpx.AsyncClient, tenants: TenantKeys
    ) -> None:
        """``Allow`` lists the methods of every route on the path, not of the first one matched."""
        h = tenants.headers("acme")
        for path, methods in (
            ("/v1/jobs/job_nope", {"GET", "DELETE"}),
            ("/v1/jobs", {"POST"}),
            ("/v1/admin/policy", {"GET", "PUT", "DELETE"}),
        ):
            r = await http.patch(path, headers=h)
            assert_error_shape(r, 405)
            assert set(r.headers["allow"].split(", ")) == methods, (path, r.headers["allow"])

    async def test_concurrent_bad_and_good(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        """A burst of mixed requests: all answered, no 5xx."""
        h = tenants.headers("acme")
        bodies = [
            {"kind": "embed", "body": EMBED},
            {"kind": "x"},
            {"kind": "embed", "body": {"input": 3}},
        ] * 5
        responses = await asyncio.gather(*(http.post("/v1/jobs", json=b, headers=h) for b in bodies))
        assert all(r.status_code < 500 for r in responses)
        assert sum(r.status_code == 202 for r in responses) == 5


class TestProcesses:
    async def test_stack_starts_the_api(self, redis_url: str, triton: Any, run_dir: Path) -> None:
        """``overspill up`` runs the API: the embedded Stack starts it next to the workers."""
        settings = StackSettings(
            run_dir=run_dir / "stack-api",
            prefix="t-stack-" + secrets.token_hex(3),
            redis_url=redis_url,
            triton_url=triton.grpc_url,
            triton_metrics_url=triton.metrics_url,
            workers=0,
            api_port=free_port(),
        )
        with Stack(settings) as stack:
            assert stack.api is not None and stack.api.alive()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.api_port}") as http:
                assert (await http.get("/readyz")).json() == {"status": "ready"}
            assert f"api http://127.0.0.1:{settings.api_port}" in stack.describe()
        assert not stack.api.alive()

    async def test_redis_down_is_503_not_a_crash(self, run_dir: Path, tenants: TenantKeys) -> None:
        """``overspill api`` against a Redis that is not there: alive, not ready, clear 503s."""
        port = free_port()
        env = {
            "OVERSPILL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "OVERSPILL_PORT": str(port),
            "OVERSPILL_TENANTS_FILE": str(tenants.path),
        }
        url = f"http://127.0.0.1:{port}"
        proc = python_process(
            "api", "stack", run_dir, env, args=["api"], ready_url=f"{url}/healthz", log_name="api-noredis"
        )
        proc.start(timeout_s=30)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                ready = await http.get("/readyz")
                assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready"
                r = await http.post(
                    "/v1/jobs", json={"kind": "embed", "body": EMBED}, headers=tenants.headers("acme")
                )
                assert_error_shape(r, 503, "store_unavailable")
                assert r.headers["retry-after"] == "1"
                assert_error_shape(await http.post("/v1/jobs", json={"kind": "embed"}), 401)
        finally:
            proc.stop()
