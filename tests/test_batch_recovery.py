"""Batches survive kills and stay bounded: a worker SIGKILLed three times, the API SIGKILLed
while submitting and finalizing, and a batch that holds in Redis only its window of lines."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import redis.asyncio as aioredis

from tests.conftest import Triton, WorkerFactory
from tests.fixtures_api import TenantKeys
from tests.fixtures_batches import (
    TERMINAL,
    BatchStack,
    assert_exactly_once,
    embed_line,
    heads,
    jsonl,
    run_batch,
    start_batch_api,
    wait_batch,
    wait_for_submitted,
)

# ---------------------------------------------------------------------------- crashes


async def test_worker_sigkilled_three_times_same_result(
    redis_url: str,
    run_dir: Path,
    tenants: TenantKeys,
    prefix: str,
    start_worker: WorkerFactory,
    triton: Triton,
) -> None:
    n = 6000
    api = start_batch_api(run_dir, redis_url, prefix, tenants.path)
    stack = BatchStack(api, prefix, None)
    triton.set_exec_ms(40)
    try:
        worker = start_worker(job_timeout_s=2)
        async with stack.sdk(tenants) as sdk:
            started = time.monotonic()
            batch = await run_batch(sdk, jsonl([embed_line(i, tag="k") for i in range(n)]))
            kills = 0
            for threshold in (n // 8, n // 3, n // 2):
                deadline = time.monotonic() + 60
                while (b := await sdk.batches.retrieve(batch.id)).request_counts.completed < threshold:
                    assert time.monotonic() < deadline, b
                    await asyncio.sleep(0.05)
                worker.kill()
                kills += 1
                worker = start_worker(job_timeout_s=2)
            done = await wait_batch(sdk, batch.id, timeout=120)
            elapsed = time.monotonic() - started
            assert done.status == "completed", done
            output = await heads(sdk, done.output_file_id)
            errors = await heads(sdk, done.error_file_id)
    finally:
        triton.set_exec_ms(5)
        api.stop()
    assert kills == 3
    assert_exactly_once([f"k-{i}" for i in range(n)], output, errors)
    assert not errors and done.request_counts.completed == n
    print(f"\n{n} lines with 3 worker SIGKILLs: {elapsed:.1f}s")


async def test_api_sigkilled_while_submitting_and_finalizing_resumes(
    redis_url: str, run_dir: Path, tenants: TenantKeys, prefix: str, start_worker: WorkerFactory
) -> None:
    """Kill the API (the batch's driver) mid-submission, and again while finalising: no line lost or doubled."""
    import redis.asyncio as aioredis

    n = 30_000
    # No worker while submitting: the window must let every line be submitted ahead of results.
    env = {
        "OVERSPILL_BATCH_LEASE_S": "1.5",
        "OVERSPILL_BATCH_CHUNK_LINES": "500",
        "OVERSPILL_BATCH_WINDOW_LINES": str(n),
    }
    api = start_batch_api(run_dir, redis_url, prefix, tenants.path, **env)
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            batch = await run_batch(sdk, jsonl([embed_line(i, tag="a") for i in range(n)]))
            await wait_for_submitted(sdk, batch.id, 1)
        api.kill()
        killed_at = int(await r.hget(f"{prefix}:v1:batch:{batch.id}", "submitted") or 0)
        api = start_batch_api(run_dir, redis_url, prefix, tenants.path, **env)
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            await wait_for_submitted(sdk, batch.id, n)
        lines = await r.lrange(f"{prefix}:v1:batch:{batch.id}:lines", 0, -1)
        job_ids = [json.loads(x)[1] for x in lines]
        chunks = [k async for k in r.scan_iter(f"{prefix}:v1:chunk:*", count=5000)]
        jobs = sum([int(await r.hget(k, "n")) for k in chunks])  # the jobs in Redis, all chunked
        assert len(lines) == n and len(set(job_ids)) == n and jobs == n  # no chunk twice
        start_worker()
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            b = await wait_batch(sdk, batch.id, timeout=120, until={"finalizing", *TERMINAL})
        hit_finalizing = b.status == "finalizing"
        if hit_finalizing:
            api.kill()
            api = start_batch_api(run_dir, redis_url, prefix, tenants.path, **env)
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            done = await wait_batch(sdk, batch.id, timeout=60)
            assert done.status == "completed", done
            output = await heads(sdk, done.output_file_id)
            errors = await heads(sdk, done.error_file_id)
    finally:
        api.stop()
        await r.aclose()
    assert 0 < killed_at < n
    assert_exactly_once([f"a-{i}" for i in range(n)], output, errors)
    assert not errors
    print(f"\nAPI killed after {killed_at}/{n} lines submitted; killed while finalizing: {hit_finalizing}")


async def jobs_held(r: aioredis.Redis, prefix: str) -> int:
    """Jobs in Redis: those of its chunks not yet written out (and removed) by their batch."""
    held = 0
    async for key in r.scan_iter(f"{prefix}:v1:chunk:*", count=5000):
        n, written = await r.hmget(key, ["n", "w"])
        held += int(n or 0) - int(written or 0)
    return held


async def test_a_batch_holds_in_redis_only_its_window_of_lines(
    redis_url: str, run_dir: Path, tenants: TenantKeys, prefix: str, start_worker: WorkerFactory
) -> None:
    """Lines are submitted at most a window ahead of those written to the output file, and a
    written line's job leaves Redis (its chunk, once all of its jobs are written): a batch of
    any size holds a bounded share of it."""
    n, window = 5000, 1000
    api = start_batch_api(run_dir, redis_url, prefix, tenants.path, OVERSPILL_BATCH_WINDOW_LINES=str(window))
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with BatchStack(api, prefix, None).sdk(tenants) as sdk:
            batch = await run_batch(sdk, jsonl([embed_line(i, tag="w") for i in range(n)]))
            await wait_for_submitted(sdk, batch.id, window)
            await asyncio.sleep(1.5)  # several driver steps: no worker, so nothing is written
            held = int(await r.hget(f"{prefix}:v1:batch:{batch.id}", "submitted") or 0)
            start_worker()
            peak_jobs = 0
            deadline = time.monotonic() + 90
            while (b := await sdk.batches.retrieve(batch.id)).status not in TERMINAL:
                assert time.monotonic() < deadline, b
                peak_jobs = max(peak_jobs, await jobs_held(r, prefix))
                await asyncio.sleep(0.1)
            output = await heads(sdk, b.output_file_id)
        left = [k async for k in r.scan_iter(f"{prefix}:v1:*", count=5000) if ":chunk:" in k or ":job:" in k]
    finally:
        api.stop()
        await r.aclose()
    assert held == window
    assert b.status == "completed" and b.request_counts.completed == n
    assert_exactly_once([f"w-{i}" for i in range(n)], output)
    assert 0 < peak_jobs <= window + 1000  # the window, and at most one submission chunk past it
    assert left == [], "every written line's job is gone, and every chunk once all its jobs are"
