"""Tenants: API key auth, isolation between tenants, rate and queued-jobs limits, hashed keys
that never reach a log, and a tenants file that is re-read when it changes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import socket
import time

import httpx
import pytest
import redis.asyncio as aioredis

from producer.contract import Keys, TenantsFile, hash_api_key, load_tenants
from tests.fixtures_api import ApiServer, TenantKeys, new_secret

EMBED = {"model": "all-MiniLM-L6-v2", "input": "tenant data"}
JOB = {"kind": "embed", "body": EMBED}


class TestAuth:
    async def test_missing_or_bad_key_is_401(self, http: httpx.AsyncClient) -> None:
        cases = [
            ({}, "missing_api_key"),
            ({"Authorization": "Basic Zm9vOmJhcg=="}, "invalid_api_key"),
            ({"Authorization": "Bearer"}, "invalid_api_key"),
            ({"Authorization": "Bearer osk_not_a_key"}, "invalid_api_key"),
        ]
        for headers, code in cases:
            for method, path in [("POST", "/v1/jobs"), ("GET", "/v1/jobs/job_x"), ("POST", "/v1/embeddings")]:
                r = await http.request(method, path, json=JOB, headers=headers)
                assert r.status_code == 401, (headers, path, r.text)
                assert r.json()["error"]["code"] == code
                assert r.headers["www-authenticate"] == "Bearer"

    async def test_a_key_is_hashed_once_per_request_and_its_tenant_reaches_the_route(
        self, tenants: TenantKeys, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The early refusal finds the tenant; the route's authentication takes it from there."""
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        from producer.api import tenants as registry_module
        from producer.api.middleware import Authenticate
        from producer.api.settings import ApiSettings
        from producer.api.state import ApiState
        from producer.api.tenants import TenantRegistry

        hashed: list[str] = []
        real = registry_module.hash_api_key
        monkeypatch.setattr(registry_module, "hash_api_key", lambda key: hashed.append(key) or real(key))
        registry = TenantRegistry(tenants.path)
        api = ApiState(ApiSettings(redis_url=redis_url, prefix=prefix, tenants_file=tenants.path), registry)

        async def whoami(request: Request) -> JSONResponse:
            return JSONResponse({"tenant": (await api.authenticate(request)).name})

        app = Authenticate(Starlette(routes=[Route("/v1/whoami", whoami)]), registry)
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://api"
            ) as http:
                mine = await http.get("/v1/whoami", headers=tenants.headers("globex"))
                assert mine.json() == {"tenant": "globex"} and hashed == [tenants.keys["globex"]]
                refused = await http.get("/v1/whoami", headers={"Authorization": "Bearer osk_wrong"})
                assert refused.status_code == 401 and hashed[1:] == ["osk_wrong"]
        finally:
            await api.client.aclose()

    async def test_another_tenants_job_is_404(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        acme, globex = tenants.headers("acme"), tenants.headers("globex")
        job_id = (await http.post("/v1/jobs", json=JOB, headers=acme)).json()["id"]
        assert (await http.get(f"/v1/jobs/{job_id}", params={"wait": 20}, headers=acme)).status_code == 200
        for method, path in [
            ("GET", f"/v1/jobs/{job_id}"),
            ("GET", f"/v1/jobs/{job_id}?wait=1"),
            ("DELETE", f"/v1/jobs/{job_id}"),
            ("GET", f"/v1/jobs/{job_id}/webhook"),
        ]:
            r = await http.request(method, path, headers=globex)
            assert r.status_code == 404, (method, path, r.text)
            assert r.json()["error"]["type"] == "not_found_error"
        listed = (await http.get("/v1/webhooks/dead-letters", headers=globex)).json()["data"]
        assert all(d["delivery"]["tenant"] == "globex" for d in listed)


class TestLimits:
    async def test_rate_limit_429_with_retry_after(self, idle_api: ApiServer, tenants: TenantKeys) -> None:
        """Tenant ``tiny``: bucket of 3, refilled at 0.5/s."""
        h = tenants.headers("tiny")
        async with httpx.AsyncClient(base_url=idle_api.url, timeout=10) as http:
            statuses = [(await http.get("/v1/jobs/job_x", headers=h)).status_code for _ in range(4)]
            limited = await http.get("/v1/jobs/job_x", headers=h)
            others = await http.get("/v1/jobs/job_x", headers=tenants.headers("globex"))
        assert statuses[:3] == [404, 404, 404] and statuses[3] == 429
        assert limited.status_code == 429
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(limited.headers["retry-after"]) <= 3
        assert others.status_code == 404  # other tenants are not limited by tiny's bucket

    async def test_a_concurrent_burst_is_admitted_up_to_the_bucket(
        self, idle_api: ApiServer, tenants: TenantKeys, redis_url: str
    ) -> None:
        """Tenant ``tiny`` (bucket of 3): of 8 requests at once, exactly 3 get through."""
        h = tenants.headers("tiny")
        async with aioredis.from_url(redis_url) as redis:
            await redis.delete(Keys(idle_api.prefix).rate("tiny"))  # a full bucket to start from
        async with httpx.AsyncClient(base_url=idle_api.url, timeout=10) as http:
            burst = await asyncio.gather(*(http.get("/v1/jobs/job_x", headers=h) for _ in range(8)))
        assert sorted(r.status_code for r in burst) == [404] * 3 + [429] * 5

    async def test_max_queued_jobs(self, idle_api: ApiServer, tenants: TenantKeys) -> None:
        """Tenant ``small`` may have 2 jobs queued; cancelling one frees a place."""
        h = tenants.headers("small")
        async with httpx.AsyncClient(base_url=idle_api.url, timeout=10) as http:
            first = await http.post("/v1/jobs", json=JOB, headers=h)
            second = await http.post("/v1/jobs", json=JOB, headers=h)
            third = await http.post("/v1/jobs", json=JOB, headers=h)
            assert (first.status_code, second.status_code, third.status_code) == (202, 202, 429)
            assert third.json()["error"]["code"] == "too_many_queued_jobs"
            assert "retry-after" in third.headers
            sync = await http.post("/v1/embeddings", json=EMBED, headers=h)
            assert sync.status_code == 429  # the synchronous endpoints count too
            assert (await http.delete(f"/v1/jobs/{first.json()['id']}", headers=h)).status_code == 200
            fourth = await http.post("/v1/jobs", json=JOB, headers=h)
            assert fourth.status_code == 202

    async def test_max_queued_holds_under_concurrent_submits(
        self, idle_api: ApiServer, tenants: TenantKeys
    ) -> None:
        """Tenant ``five`` may have 5 jobs queued: 60 submits at once admit exactly 5."""
        h = tenants.headers("five")
        async with httpx.AsyncClient(base_url=idle_api.url, timeout=30) as http:
            answers = await asyncio.gather(*(http.post("/v1/jobs", json=JOB, headers=h) for _ in range(60)))
        codes = sorted(r.status_code for r in answers)
        assert codes == [202] * 5 + [429] * 55


class TestIsolation:
    async def test_waiting_on_another_tenants_job_is_404_at_once(
        self, idle_api: ApiServer, tenants: TenantKeys
    ) -> None:
        acme, globex = tenants.headers("acme"), tenants.headers("globex")
        async with httpx.AsyncClient(base_url=idle_api.url, timeout=30) as http:
            job_id = (await http.post("/v1/jobs", json=JOB, headers=acme)).json()["id"]  # stays queued
            started = time.monotonic()
            r = await http.get(f"/v1/jobs/{job_id}", params={"wait": 5}, headers=globex)
            assert r.status_code == 404 and time.monotonic() - started < 1.5

    async def test_a_foreign_waiter_leaves_the_owner_its_result(
        self, http: httpx.AsyncClient, tenants: TenantKeys
    ) -> None:
        acme, globex = tenants.headers("acme"), tenants.headers("globex")
        job_id = (await http.post("/v1/jobs", json=JOB, headers=acme)).json()["id"]
        foreign, mine = await asyncio.gather(
            http.get(f"/v1/jobs/{job_id}", params={"wait": 20}, headers=globex),
            http.get(f"/v1/jobs/{job_id}", params={"wait": 20}, headers=acme),
        )
        assert foreign.status_code == 404
        assert mine.json()["status"] == "succeeded"

    async def test_ids_never_reach_another_key(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        """An id with a key separator or a glob is simply not found (never a 5xx)."""
        acme = tenants.headers("acme")
        for path in [
            "/v1/jobs/job_x:result",
            "/v1/jobs/*",
            "/v1/batches/batch_x:lines",
            "/v1/files/file-x:content",
            "/v1/jobs/job_x:result/webhook",
        ]:
            r = await http.get(path, headers=acme)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["error"]["type"] == "not_found_error"

    def test_an_upload_without_a_key_is_refused_before_its_body_is_read(
        self, http: httpx.AsyncClient
    ) -> None:
        """A stranger declares a 100 MB upload and sends 1 MB: the 401 comes at once."""
        url = httpx.URL(str(http.base_url))
        with socket.create_connection((url.host, url.port), timeout=5) as sock:
            head = (
                "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                f"Content-Length: {100 * 1024 * 1024}\r\n\r\n"
            )
            sock.sendall(head.encode() + b"x" * (1024 * 1024))
            answer = b""
            while b"}}" not in answer and len(answer) < 65536:
                chunk = sock.recv(4096)  # times out (5 s) if the server waits for the whole body
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"missing_api_key" in answer


class TestSecretsStayHidden:
    def test_tenants_file_holds_digests_only(self, tenants: TenantKeys) -> None:
        text = tenants.path.read_text()
        for key in tenants.keys.values():
            assert key not in text
            assert hashlib.sha256(key.encode()).hexdigest() in text

    async def test_logs_never_show_keys_or_secrets(
        self, http: httpx.AsyncClient, api_stack: ApiServer, tenants: TenantKeys
    ) -> None:
        await http.post("/v1/jobs", json=JOB, headers=tenants.headers("acme"))
        await http.post("/v1/jobs", json=JOB, headers={"Authorization": "Bearer osk_leaky_guess_123"})
        await asyncio.sleep(0.5)
        logs = api_stack.log_text()
        assert '"tenant": "acme"' in logs  # requests are logged, with their tenant
        for key in [*tenants.keys.values(), "osk_leaky_guess_123"]:
            assert key not in logs
        for secret in (s for group in tenants.secrets.values() for s in group):
            assert secret not in logs and secret.removeprefix("whsec_") not in logs


class TestTenantsFile:
    def test_validation(self, tmp_path: os.PathLike[str]) -> None:
        good = {
            "name": "a",
            "api_key_sha256": [hash_api_key("k")],
            "webhook_secrets": {"default": [new_secret()]},
        }
        assert TenantsFile.model_validate({"tenants": [good]}).tenants[0].name == "a"
        bad = [
            {"tenants": [{**good, "api_key_sha256": ["plain-key"]}]},  # a key, not its digest
            {"tenants": [{**good, "webhook_secrets": {"default": ["not-whsec"]}}]},
            {"tenants": [{**good, "webhook_secrets": {"default": ["whsec_c2hvcnQ="]}}]},  # too short
            {"tenants": [good, good]},  # duplicate
            {"tenants": [{**good, "rate_per_s": 0}]},
        ]
        for doc in bad:
            path = f"{tmp_path}/t-{secrets.token_hex(3)}.json"
            with open(path, "w") as f:
                json.dump(doc, f)
            with pytest.raises(ValueError, match="tenants file"):
                load_tenants(path)

    async def test_new_key_works_without_restart(self, http: httpx.AsyncClient, tenants: TenantKeys) -> None:
        key = "osk_" + secrets.token_urlsafe(24)
        h = {"Authorization": f"Bearer {key}"}
        assert (await http.post("/v1/jobs", json=JOB, headers=h)).status_code == 401
        doc = json.loads(tenants.path.read_text())
        doc["tenants"].append({"name": "newco", "api_key_sha256": [hash_api_key(key)]})
        tmp = tenants.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, tenants.path)  # atomic, as a secret mount updates
        deadline = time.monotonic() + 5
        status = 401
        while status == 401 and time.monotonic() < deadline:
            status = (await http.post("/v1/jobs", json=JOB, headers=h)).status_code
            await asyncio.sleep(0.1)
        assert status == 202
