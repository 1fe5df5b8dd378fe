"""The API under a fuzzer, run as an outsider runs it: schemathesis's own CLI against
``/openapi.json``.

Every operation, the fuzzing and the stateful phases (the document's links lead from a created
job, file or batch to the operations that read, stream, cancel or delete it), every check
(``-c all``), a fixed seed, once with a tenant's key and once with an admin's. Nothing may fail:
no 5xx, every status, body and header as documented, every request the schema calls valid
accepted and every one it calls invalid refused, and no answer that changes when the same
request is sent again. ``make test`` runs a short form; ``make fuzz`` the long one
(``OVERSPILL_FUZZ_EXAMPLES``: examples per operation).

The fuzz has an API and a worker of its own: an admin key may change the routing policy and
cancel any tenant's job, which no other test's stack should see.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from producer.contract import Keys
from tests.conftest import Triton, worker_env
from tests.fixtures_api import ApiServer, Receiver, TenantKeys, api_with_worker

EXAMPLES = int(os.environ.get("OVERSPILL_FUZZ_EXAMPLES", "15"))
ST = Path(sys.executable).with_name("st")


@pytest.fixture(scope="module")
def fuzz_stack(
    redis_url: str, triton: Triton, run_dir: Path, tenants: TenantKeys, receiver: Receiver
) -> Iterator[ApiServer]:
    prefix = "t-fuzz-" + secrets.token_hex(3)
    env = worker_env(
        redis_url, triton, prefix, tenants_file=tenants.path, webhook_allow_hosts=f"127.0.0.1:{receiver.port}"
    )
    # A stream of a job the fuzz left queued ends after 2 s without an event, not 30.
    with api_with_worker(
        run_dir, redis_url, prefix, tenants.path, env, OVERSPILL_STREAM_IDLE_TIMEOUT_S="2"
    ) as server:
        yield server


def schemathesis_run(url: str, key: str, examples: int, report: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as an outsider types it; it keeps its files (.schemathesis/) beside the report."""
    command = [
        str(ST), "run", f"{url}/openapi.json",
        "--header", f"Authorization: Bearer {key}",
        "--phases", "fuzzing,stateful",
        "--checks", "all",
        "--seed", "1",
        "--max-examples", str(examples),
        "--request-timeout", "30",
        "--no-color",
        "--report", "junit", "--report-junit-path", str(report),
    ]  # fmt: skip
    return subprocess.run(
        command, capture_output=True, text=True, timeout=900, check=False, cwd=report.parent
    )


def failures_of(output: str) -> str:
    """The CLI's FAILURES and ERRORS sections (what a reader needs), else its tail."""
    found = re.search(r"=+ (FAILURES|ERRORS) =+.*?(?==+ (WARNINGS|SUMMARY) =+)", output, re.S)
    return found.group(0) if found else output[-4000:]


@pytest.mark.parametrize("who", ["wide", "ops"])  # a tenant's key, an admin's
def test_the_fuzzer_finds_nothing(
    fuzz_stack: ApiServer, tenants: TenantKeys, redis_url: str, run_dir: Path, who: str
) -> None:
    report = run_dir / f"fuzz-{who}.xml"
    run = schemathesis_run(fuzz_stack.url, tenants.keys[who], EXAMPLES, report)
    summary = run.stdout[run.stdout.rfind("SUMMARY") :]
    assert run.returncode == 0, failures_of(run.stdout) + run.stderr[-2000:]
    # The run reached every operation the document lists.
    selected = re.search(r"Selected: (\d+)/(\d+)", summary)
    tested = re.search(r"Tested: (\d+)", summary)
    assert selected and tested and int(tested.group(1)) == int(selected.group(2)) >= 30, summary
    assert "Stateful" in summary and "Fuzzing" in summary, summary
    assert "Server error" not in run.stdout
    leftovers = asyncio.run(open_state(redis_url, fuzz_stack.prefix))
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
