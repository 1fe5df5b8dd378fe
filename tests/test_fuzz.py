"""Property-based fuzz of every route, from the API's own OpenAPI document (schemathesis).

As a tenant whose limits let it reach every operation, with data the schema allows and data it
does not: no answer is a 5xx, every status, body and ``Allow`` header is one the schema
documents, and every request the schema calls valid is accepted. ``make fuzz`` runs the same with many more examples.
"""

from __future__ import annotations

import asyncio
import os
import time

import redis.asyncio as aioredis
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from producer.contract import Keys
from tests.fixtures_api import ApiServer, TenantKeys

EXAMPLES = int(os.environ.get("OVERSPILL_FUZZ_EXAMPLES", "15"))
# No 5xx; statuses, content types, bodies and Allow headers as documented; and every request
# the schema calls valid is accepted (2xx, or 401/403/404 where a key or an id decides).
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    positive_data_acceptance,
    allow_header_conformance,
]


def test_every_operation_answers_as_documented(
    api_stack: ApiServer, tenants: TenantKeys, redis_url: str
) -> None:
    schema = schemathesis.openapi.from_url(f"{api_stack.url}/openapi.json")
    headers = tenants.headers("wide")
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation, mode in [(op, mode) for op in operations for mode in GenerationMode]:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
            derandomize=True,
            database=None,
        )
        def fuzz(case: schemathesis.Case) -> None:
            response = case.call(headers=headers, timeout=30)
            case.validate_response(response, checks=CHECKS)

        try:
            fuzz()
        except Unsatisfiable:  # an operation without parameters has no invalid data to send
            continue
        except BaseException as exc:  # noqa: BLE001  # collect every operation's failure, then report them together
            failures.append(f"{operation.label} ({mode.value} data): {str(exc)[:600]}")
    assert not failures, "\n\n".join(failures)
    leftovers = asyncio.run(open_state(redis_url, api_stack.prefix))
    assert leftovers == {"without_ttl": [], "open_jobs": [], "active_batches": []}


async def open_state(redis_url: str, prefix: str, timeout_s: float = 60.0) -> dict[str, list[str]]:
    """What the fuzz left behind once its jobs had time to finish: records without a TTL, jobs
    still open, batches still active (all must be empty)."""
    keys = Keys(prefix)
    redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = [k async for k in redis.scan_iter(match=keys.job("*"), count=1000)]
            without_ttl = [k for k in jobs if await redis.ttl(k) == -1]
            statuses = [await redis.hget(k, "status") for k in jobs]
            open_jobs = [k for k, st in zip(jobs, statuses, strict=True) if st in ("queued", "running")]
            active = sorted(await redis.smembers(keys.active_batches()))
            if (not open_jobs and not active) or time.monotonic() > deadline:
                return {"without_ttl": without_ttl, "open_jobs": open_jobs[:10], "active_batches": active}
            await asyncio.sleep(0.5)
    finally:
        await redis.aclose()
