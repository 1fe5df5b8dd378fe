"""``python -m bench webhooks``: how fast one worker delivers one tenant's webhooks.

``JOBS`` fixed-cost jobs, each with a webhook to :mod:`bench.receiver` on loopback (it answers
at once), submitted with ``submit_many``; measured from the first submission until the receiver
has every delivery. Reported: deliveries/s, the worker's CPU per delivery (running the jobs
included) and the connections the receiver accepted. At the default per-tenant cap of
deliveries in flight in a worker (8) and with it raised to 32, alternating, ``REPS`` each: one
tenant's burst is what the cap holds back, so the pair shows what the cap costs that tenant.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from producer import Client
from stack.processes import free_port
from workers.delivery import WebhookSettings

from .cpu import CpuMeter
from .harness import FIXED, Harness
from .runner import save_standalone

JOBS = 6_000
REPS = 2
CAPS = (WebhookSettings().webhook_tenant_max_inflight, 32)
TIMEOUT_S = 300.0


def start_receiver(h: Harness) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    h.start_process("receiver", "bench.receiver", {}, [str(port)], ready_url=f"{url}/count")
    return url


async def counts(http: httpx.AsyncClient) -> dict[str, int]:
    answer: dict[str, int] = (await http.get("/count")).json()
    return answer


async def deliver_all(h: Harness, receiver: str, cap: int, rep: int) -> dict[str, Any]:
    """One run: a worker with the tenant cap at ``cap``, ``JOBS`` jobs with webhooks."""
    env = {"OVERSPILL_WEBHOOK_ALLOW_HOSTS": receiver.removeprefix("http://")}
    if cap != CAPS[0]:
        env["OVERSPILL_WEBHOOK_TENANT_MAX_INFLIGHT"] = str(cap)
    prefix = f"bench-webhooks-{cap}-{rep}"
    worker = h.start_worker(prefix, **env)
    hook = {"url": f"{receiver}/hook"}
    async with httpx.AsyncClient(base_url=receiver) as http, Client(h.redis_url, prefix=prefix) as client:
        before = await counts(http)
        with CpuMeter({"worker": worker.pid}) as meter:
            started = time.perf_counter()
            for first in range(0, JOBS, 1_000):
                requests = [
                    ("embed", {"model": FIXED, "input": f"w{i}"}) for i in range(first, first + 1_000)
                ]
                await client.submit_many(requests, webhook=hook)
            now = before
            while now["posts"] - before["posts"] < JOBS:
                if time.perf_counter() - started > TIMEOUT_S:
                    raise SystemExit(
                        f"{now['posts'] - before['posts']} of {JOBS} webhooks in {TIMEOUT_S:g} s"
                    )
                await asyncio.sleep(0.1)
                now = await counts(http)
            seconds = time.perf_counter() - started
    h.stop_worker(worker)
    h.flush()
    return {
        "cap": cap,
        "deliveries_per_s": round(JOBS / seconds, 1),
        "worker_cpu_ms_per_delivery": meter.ms_per_item(JOBS)["worker"],
        "connections": now["connections"] - before["connections"],
    }


async def measure() -> dict[str, Any]:
    with Harness.start() as h:
        receiver = start_receiver(h)
        runs = [await deliver_all(h, receiver, cap, rep) for rep in range(REPS) for cap in CAPS]
    out: dict[str, Any] = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "jobs": JOBS}
    for cap in CAPS:
        mine = [r for r in runs if r["cap"] == cap]
        out[f"webhooks_per_s_cap{cap}"] = round(statistics.median(r["deliveries_per_s"] for r in mine), 1)
        cpu = statistics.median(r["worker_cpu_ms_per_delivery"] for r in mine)
        out[f"webhooks_worker_cpu_ms_cap{cap}"] = round(cpu, 3)
    out["details"] = {"runs": runs}
    return out


def main() -> dict[str, Any]:
    return save_standalone("webhooks", asyncio.run(measure()))


def section(c: dict[str, Any]) -> list[str]:
    """The docs/benchmarks.md section of a webhooks run (bench/report.py adds it when webhooks.json exists)."""
    rows = [
        f"| {r['cap']}{' (default)' if r['cap'] == CAPS[0] else ''} | {r['deliveries_per_s']:,} | "
        f"{r['worker_cpu_ms_per_delivery']} | {r['connections']:,} |"
        for r in c["details"]["runs"]
    ]
    return [
        "## Webhooks: one tenant's deliveries from one worker",
        "",
        f"Command: `python -m bench webhooks` (measured {c['measured_at']}). {c['jobs']:,} fixed-cost jobs "
        "with a webhook each, to a receiver on loopback that answers at once (`bench/receiver.py`); "
        "from the first submission to the last delivery. Each run:",
        "",
        "| tenant cap in flight | deliveries/s | worker CPU ms per delivery (jobs included) | connections |",
        "|---|---|---|---|",
        *rows,
        "",
        "A worker claims up to 64 deliveries at a time and puts off those past the tenant's cap, "
        "queueing them again with growing waits, so one tenant's burst pays for that churn.",
        "",
    ]
