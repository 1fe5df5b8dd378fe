"""P4: offered load at 3× local capacity, with overflow to a fake remote on vs off.

Local capacity is made small and known: the fixed-cost model's per-execution time is raised
to ``Sizes.overflow_exec_ms`` (1 s in the full run: capacity ≈ max_batch × 1000 / exec_ms
items/s), so three times it is a load
the load generator can offer. The remote is ``stack.fake_remote`` with a fixed latency.
Needs ``workers.backends.remote.client`` and ``stack.fake_remote``; reports "not run" without them.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import httpx

from producer import JobResult
from stack.processes import free_port

from . import load
from .context import Context
from .cpu import CpuMeter
from .harness import FIXED, TRITON_NAME, Harness
from .stats import ratio

MAX_BATCH = 64
REMOTE_LATENCY_MS = 50.0
OFFERED_X = 3.0
METRICS_REFRESH_S = 2.2  # Triton refreshes its metrics about every 2 s
REQUIRED = ("workers.backends.remote.client", "stack.fake_remote")


def missing_modules() -> list[str]:
    return [m for m in REQUIRED if importlib.util.find_spec(m) is None]


def start_remote(h: Harness, latency_ms: float) -> tuple[str, int]:
    """A fake remote of this run answering after ``latency_ms``: its URL and pid."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = h.start_process(
        "fake-remote", "stack.fake_remote", {}, ["--port", str(port)], ready_url=f"{url}/_health"
    )
    httpx.post(f"{url}/_control", json={"latency_ms": latency_ms}, timeout=5).raise_for_status()
    return url, proc.pid


def worker_env(remote_url: str, overflow: bool) -> dict[str, str]:
    return {
        "OVERSPILL_REMOTE_BASE_URL": f"{remote_url}/v1",
        "OVERSPILL_REMOTE_API_KEY": "bench-key",
        "OVERSPILL_REMOTE_SAME_MODELS": f'["{FIXED}"]',
        "OVERSPILL_GATEWAY_MODE": "hybrid" if overflow else "triton",
    }


def route_figures(routes: list[tuple[str | None, int]]) -> dict[str, float]:
    """Remote share, and the mean Triton batch of the jobs that stayed local.

    ``routes`` holds each job's (route, batch size), not its envelope (see ``bench.load``).
    """
    local = [size for route, size in routes if route == "local"]
    remote = sum(1 for route, _ in routes if route == "remote")
    return {
        "remote_share": round(remote / len(routes), 3) if routes else 0.0,
        "local_mean_batch": round(sum(local) / len(local), 2) if local else 0.0,
    }


async def offered_run(ctx: Context, remote_url: str, remote_pid: int, overflow: bool) -> dict[str, Any]:
    """Open-loop load at ``OFFERED_X`` × local capacity through a worker with overflow on or off."""
    h, s = ctx.harness, ctx.sizes
    prefix = f"bench-p4-{'on' if overflow else 'off'}"
    worker = h.start_worker(prefix, **worker_env(remote_url, overflow))
    capacity = MAX_BATCH * 1000 / s.overflow_exec_ms
    rate = capacity * OFFERED_X
    n = int(rate * s.overflow_seconds) + 1
    routes: list[tuple[str | None, int]] = []
    before, t0 = h.triton.counters(TRITON_NAME[FIXED]), time.monotonic()
    meter = CpuMeter({**ctx.pids(), "fake_remote": remote_pid})
    async with ctx.client(prefix) as client:
        call = load.overspill_call(client, FIXED, n, timeout_s=s.timeout_s)

        async def recording(i: int) -> JobResult:
            result = await call(i)
            routes.append((result.route, result.timings.batch_size))
            return result

        with meter, ctx.packing() as packing:
            run = await load.open_loop(recording, rate, s.overflow_seconds, timeout_s=s.timeout_s)
    time.sleep(METRICS_REFRESH_S)
    after, elapsed = h.triton.counters(TRITON_NAME[FIXED]), time.monotonic() - t0 - METRICS_REFRESH_S
    h.stop_worker(worker)
    h.flush()
    summary = run.summary()
    busy = (after.compute_us - before.compute_us) / 1e6 / elapsed if elapsed > 0 else 0.0
    return {
        "overflow": overflow,
        "offered_per_s": round(rate, 1),
        "local_capacity_per_s": round(capacity, 1),
        **summary,
        "p99_wait_s": round(summary.get("p99_ms", 0.0) / 1000, 3),
        **route_figures(routes),
        "local_busy_fraction": round(min(busy, 1.0), 3),
        "cpu_ms_per_item": meter.ms_per_item(run.items),
        **packing,
    }


async def p4(ctx: Context) -> None:
    missing = missing_modules()
    keys = ("p4_p99_wait_s_on", "p4_p99_wait_s_off", "p4_remote_share")
    if missing:
        ctx.details["p4"] = {"run": False, "reason": f"missing modules: {', '.join(missing)}"}
        ctx.headline.update(dict.fromkeys(keys))
        return
    h = ctx.harness
    h.stop_workers()
    h.triton.set_exec_ms(ctx.sizes.overflow_exec_ms)
    try:
        remote_url, remote_pid = start_remote(h, REMOTE_LATENCY_MS)
        on = await offered_run(ctx, remote_url, remote_pid, overflow=True)
        off = await offered_run(ctx, remote_url, remote_pid, overflow=False)
    finally:
        h.stop_workers()
        h.triton.set_exec_ms(5.0)
    ctx.details["p4"] = {
        "run": True,
        "remote_latency_ms": REMOTE_LATENCY_MS,
        "exec_ms": ctx.sizes.overflow_exec_ms,
        "on": on,
        "off": off,
    }
    ctx.headline["p4_p99_wait_s_on"] = on["p99_wait_s"]
    ctx.headline["p4_p99_wait_s_off"] = off["p99_wait_s"]
    ctx.headline["p4_remote_share"] = on["remote_share"]
    ctx.headline["p4_p99_off_vs_on"] = ratio(off["p99_wait_s"], on["p99_wait_s"])
