"""Isolation: what one tenant sends cannot fail another tenant's requests.

The API packs concurrent requests of every tenant into shared work packages, so a value that
JSON accepts but the wire cannot carry (a lone surrogate, an integer past 64 bits, a deadline
of ``Infinity``, nesting deeper than 64) must be refused at the edge with a 400, and a
package whose write fails anyway is written again item by item.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import redis.asyncio as aioredis

from producer import Client, InvalidBody
from producer.contract import Keys
from tests.fixtures_api import ApiServer, TenantKeys

MODEL = "all-MiniLM-L6-v2"

# Raw request bodies, as an attacker would type them (not via json.dumps); @M is the model.
POISON_JOBS = {
    "surrogate input": '{"kind": "embed", "body": {"model": "@M", "input": "\\ud800"}}',
    "surrogate in an unknown field": '{"kind": "embed", "body": {"model": "@M", "input": "x", "u": "\\udfff"}}',
    "surrogate in a key": '{"kind": "embed", "body": {"model": "@M", "input": "x", "\\ud800": 1}}',
    "integer of 10^30": '{"kind": "embed", "body": {"model": "@M", "input": "x", "n": 1' + "0" * 30 + "}}",
    "deadline Infinity": '{"kind": "embed", "body": {"model": "@M", "input": "x"}, "options": {"deadline": Infinity}}',
    "deadline 1e308": '{"kind": "embed", "body": {"model": "@M", "input": "x"}, "options": {"deadline": 1e308}}',
    "deadline 1e18": '{"kind": "embed", "body": {"model": "@M", "input": "x"}, "options": {"deadline": 1e18}}',
    "surrogate metadata": '{"kind": "embed", "body": {"model": "@M", "input": "x"}, "options": {"metadata": {"k": "\\ud800"}}}',
    "600 levels in an unknown field": '{"kind": "embed", "body": {"model": "@M", "input": "x", "deep": '
    + "[" * 600
    + "]" * 600
    + "}}",
}
POISON_SYNC = {
    "surrogate input": '{"model": "@M", "input": ["fine", "\\ud800"]}',
    "integer of 10^30": '{"model": "@M", "input": "x", "dimensions": 1' + "0" * 30 + "}",
    "100 000 levels": '{"model": "@M", "input": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
}
JSON = {"Content-Type": "application/json"}


def assert_clean_400(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text[:300]
    error = json.loads(r.content)["error"]  # the body is valid JSON, whatever the input held
    assert error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize("poison", list(POISON_JOBS))
async def test_a_poisoned_job_is_a_400_and_fails_no_one_else(
    poison: str, http: httpx.AsyncClient, tenants: TenantKeys
) -> None:
    wide, globex = tenants.headers("wide"), tenants.headers("globex")
    good = [
        http.post(
            "/v1/jobs", json={"kind": "embed", "body": {"model": MODEL, "input": f"a{i}"}}, headers=wide
        )
        for i in range(30)
    ]
    bad = [
        http.post("/v1/jobs", content=POISON_JOBS[poison].replace("@M", MODEL), headers={**globex, **JSON})
        for _ in range(3)
    ]
    answers = await asyncio.gather(*good, *bad)
    for r in answers[30:]:
        assert_clean_400(r)
    assert [r.status_code for r in answers[:30]] == [202] * 30
    done = await asyncio.gather(
        *(http.get(f"/v1/jobs/{r.json()['id']}", params={"wait": 30}, headers=wide) for r in answers[:30])
    )
    assert [d.json().get("status") for d in done] == ["succeeded"] * 30, [
        d.text[:300] for d in done if "succeeded" not in d.text
    ]


@pytest.mark.parametrize("poison", list(POISON_SYNC))
async def test_a_poisoned_sync_call_is_a_400_and_fails_no_one_else(
    poison: str, http: httpx.AsyncClient, tenants: TenantKeys
) -> None:
    wide, globex = tenants.headers("wide"), tenants.headers("globex")
    good = [
        http.post("/v1/embeddings", json={"model": MODEL, "input": f"s{i}"}, headers=wide) for i in range(30)
    ]
    bad = [
        http.post(
            "/v1/embeddings", content=POISON_SYNC[poison].replace("@M", MODEL), headers={**globex, **JSON}
        )
        for _ in range(3)
    ]
    answers = await asyncio.gather(*good, *bad)
    for r in answers[30:]:
        assert_clean_400(r)
    assert [r.status_code for r in answers[:30]] == [200] * 30
    assert all(len(r.json()["data"][0]["embedding"]) == 384 for r in answers[:30])


async def test_a_refused_request_claims_no_idempotency_key(
    http: httpx.AsyncClient, tenants: TenantKeys
) -> None:
    wide = {**tenants.headers("wide"), "Idempotency-Key": "retry-after-400"}
    r = await http.post(
        "/v1/jobs", content=POISON_JOBS["deadline 1e18"].replace("@M", MODEL), headers={**wide, **JSON}
    )
    assert_clean_400(r)
    fixed = {"kind": "embed", "body": {"model": MODEL, "input": "fixed"}, "options": {"deadline": 60}}
    job = (await http.post("/v1/jobs", json=fixed, headers=wide)).json()
    done = await http.get(f"/v1/jobs/{job['id']}", params={"wait": 30}, headers=wide)
    assert done.json()["status"] == "succeeded"


class TestPackingSurvivesWhatSlipsThrough:
    """A library producer may skip validation (``validate=False``): packing must still isolate."""

    async def test_one_unencodable_item_fails_only_its_own_submit(
        self, redis_url: str, api_stack: ApiServer
    ) -> None:
        async with Client(redis_url, prefix=api_stack.prefix, coalesce_window_ms=50) as client:
            body = {"model": MODEL, "input": "ok"}
            poisoned = {"model": MODEL, "input": "x", "n": 10**30}
            outcomes = await asyncio.gather(
                *(client.submit("embed", body) for _ in range(10)),
                client.submit("embed", poisoned, validate=False),
                return_exceptions=True,
            )
            ids = outcomes[:10]
            assert all(isinstance(i, str) for i in ids), ids
            assert isinstance(outcomes[10], InvalidBody), outcomes[10]
            results = await client.wait_many(ids, timeout=60)  # type: ignore[arg-type]
            assert [r.status.value for r in results] == ["succeeded"] * 10

    async def test_a_failed_write_releases_its_idempotency_key(
        self, redis_url: str, api_stack: ApiServer
    ) -> None:
        async with Client(redis_url, prefix=api_stack.prefix, coalesce_window_ms=None) as client:
            with pytest.raises(InvalidBody):
                await client.submit(
                    "embed", {"model": MODEL, "input": "x", "n": 10**30}, validate=False, idempotency_key="k1"
                )
            job_id = await client.submit("embed", {"model": MODEL, "input": "x"}, idempotency_key="k1")
            assert (await client.wait(job_id, 60)).status.value == "succeeded"


async def test_no_record_is_left_without_a_ttl(redis_url: str, api_stack: ApiServer) -> None:
    """After every poison above (and the good jobs), each job record still expires."""
    redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        pattern = Keys(api_stack.prefix).job("*")
        ttls = [await redis.ttl(key) async for key in redis.scan_iter(match=pattern, count=1000)]
    finally:
        await redis.aclose()
    assert ttls, "the tests above left job records"
    assert min(ttls) > 0, "a job record has no TTL"
