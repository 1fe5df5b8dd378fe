"""P6 through the HTTP API: single-item ``POST /v1/embeddings`` calls at saturation.

The API process coalesces concurrent requests into shared work packages and waits for them
on its reply list, as the async client does. Requests are authenticated with a bearer key
of a tenant from a tenants file, so the measured path includes the key lookup, the tenant's
rate limit and its queued-jobs quota (sized here so that they never refuse a request), and the
API logs at its default level (a line per request), as ``overspill up`` runs it. The load
generator here is a closed loop of
``users`` keep-alive connections (:mod:`bench.http`), each sending its next request when the
last one returns,
so on a 2-core machine its HTTP cost shares the cores with the API, Redis, the worker and
Triton; the CPU split is recorded beside the rate.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from producer.contract import hash_api_key
from stack.processes import ManagedProcess, free_port

from .context import MAIN_PREFIX, Context
from .cpu import CpuMeter
from .harness import Harness
from .http import Connection, HttpError
from .load import body, texts, timed_phase
from .stats import Run, reps_summary

WARMUP = 256
BENCH_LIMIT = 1_000_000  # the tenant's rate, burst and queued-jobs limits: never the bottleneck


def tenants_file(run_dir: Path) -> tuple[Path, str]:
    """A tenants file with one tenant, and that tenant's API key."""
    key = "osk_bench_" + secrets.token_urlsafe(16)
    tenant = {
        "name": "bench",
        "api_key_sha256": [hash_api_key(key)],
        "rate_per_s": BENCH_LIMIT,
        "burst": BENCH_LIMIT,
        "max_queued": BENCH_LIMIT,
    }
    path = run_dir / "bench-tenants.json"
    path.write_text(json.dumps({"tenants": [tenant]}))
    return path, key


async def closed_loop(conns: list[Connection], model: str, n: int, timeout_s: float) -> Run:
    """One user per connection, each sending its next embedding request when the last one returns."""
    return await http_loop(
        conns,
        n,
        timeout_s,
        path="/v1/embeddings",
        payload=lambda text: body(model, text),
        expect=b'"embedding"',
    )


async def http_loop(
    conns: list[Connection],
    n: int,
    timeout_s: float,
    *,
    path: str,
    payload: Callable[[str], dict[str, Any]],
    expect: bytes,
) -> Run:
    """``n`` POSTs to ``path`` over ``conns``, one user per connection, each sending its next
    when the last one returns; an answer counts if it is a 200 holding ``expect``."""
    queue = iter(texts(n))
    latencies: list[float] = []
    failed = 0

    async def user(conn: Connection) -> None:
        nonlocal failed
        for text in queue:
            t0 = time.perf_counter()
            try:
                status, raw = await conn.post(path, payload(text))
            except (OSError, HttpError, asyncio.IncompleteReadError):
                failed += 1
                continue
            if status != 200 or expect not in raw:
                failed += 1
                continue
            latencies.append((time.perf_counter() - t0) * 1000)

    with timed_phase():
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(user(c) for c in conns)), timeout_s)
        seconds = time.perf_counter() - start
    return Run(len(latencies), seconds, latencies, failed)


def start_api(h: Harness, prefix: str, users: int) -> tuple[ManagedProcess, list[Connection]]:
    """An API process on ``prefix`` with a one-tenant file (default log level, as
    ``overspill up`` runs it), and ``users`` keep-alive connections carrying that tenant's key."""
    port = free_port()
    tenants, key = tenants_file(h.run_dir)
    env = {
        "OVERSPILL_REDIS_URL": h.redis_url,
        "OVERSPILL_PREFIX": prefix,
        "OVERSPILL_PORT": str(port),
        "OVERSPILL_RESULT_TTL_S": "600",
        "OVERSPILL_TENANTS_FILE": str(tenants),
    }
    api = h.start_process("api", "producer.api", env, [], ready_url=f"http://127.0.0.1:{port}/healthz")
    return api, [Connection("127.0.0.1", port, {"Authorization": f"Bearer {key}"}) for _ in range(users)]


async def through_api(ctx: Context, model: str, n: int, users: int) -> dict[str, Any]:
    """Items/s of single-item embedding requests through a real API process."""
    h, s = ctx.harness, ctx.sizes
    ctx.main_worker()
    api, conns = start_api(h, MAIN_PREFIX, users)
    try:
        await closed_loop(conns, model, max(min(n, WARMUP), users), s.timeout_s)
        pids = {**ctx.pids(), "api": api.pid}
        with CpuMeter(pids) as meter, ctx.packing() as packing:
            runs = [await closed_loop(conns, model, n, s.timeout_s) for _ in range(s.reps)]
    finally:
        await asyncio.gather(*(c.close() for c in conns))
        h.stop_worker(api)
    h.flush()
    out = reps_summary(runs)
    out["cpu_ms_per_item"] = meter.ms_per_item(sum(r.items for r in runs))
    out.update(packing)
    out["users"] = users
    return out
