"""``python -m bench chaos``: the system's promises under faults, counted job by job.

Starts its own redis-server (AOF, fsync every second), tritonserver (``fixed_cost`` only, slowed
to 50 ms per execution, about 1 300 items/s: a backend that is the limit, as a GPU is) and
worker processes with the default settings, on free loopback ports. Jobs belong to three tenants
(``chaos_parts.submit``), so the lanes' fair share runs under every fault. The runs:

- backlog: ``jobs`` jobs submitted at once, no fault → ``chaos_mean_attempts_backlog``;
- kills (:mod:`bench.chaos_kills`): ``jobs`` jobs with two workers, one of them SIGKILLed every
  2 s while work is left, ``kills`` times at most (a new one started each time, as an
  orchestrator would), against the same run without kills → ``chaos_goodput_vs_nofault``,
  ``chaos_lost_kills``, ``chaos_double_writes_kills``; the same with ONE worker, killed and
  restarted each time, against one worker without kills → ``chaos_goodput_one_worker``;
- recovery: in the two-worker kills run, each kill to the first package of the killed worker
  run again elsewhere (its lease, ``package_lease_s`` 5 s, runs out first) →
  ``chaos_kill_to_reclaim_s`` (p99); and a worker process started with work queued to that
  work's first result (which bounds its first claim) → ``worker_start_to_first_result_s``
  (median of 3), beside the time its imports take;
- redis: Redis SIGKILLed mid-run and restarted on its port 3 s later, the same worker
  processes → ``chaos_redis_terminal_s`` (restart to every job terminal), ``chaos_lost_redis``;
- slowdown and CPU hog (:mod:`bench.chaos_slow`), with a 5 s time limit: the model's cost
  raised 5× mid-run (300 → 1 500 ms per execution) for 15 s, then back; and 6 busy-looping
  processes competing with everything for 15 s → ``chaos_slowdown_goodput``,
  ``chaos_cpu_hog_goodput`` (items/s while degraded ÷ the degraded model's direct rate) and
  ``chaos_slowdown_empty_timeouts``, ``chaos_cpu_hog_empty_timeouts`` (packages timed out with
  nothing kept).

Writes ``bench/results/chaos.json``; ``python -m bench report`` adds it to docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from producer import Client
from stack.processes import free_port, redis_process, start_triton

from . import chaos_kills, chaos_parts, chaos_slow
from .chaos_parts import Parts, outcome, p99, submit
from .runner import save_standalone

EXEC_MS = 50.0
# The kill and slowdown runs slow the model to about 210 items/s, so that 10 000 jobs take
# about 45 s and 20 kills 2 s apart land while work is left (the real embedding model here is
# about as fast).
KILL_EXEC_MS = 300.0


async def backlog(parts: Parts, jobs: int) -> dict[str, Any]:
    worker = parts.worker("chaos-backlog", "worker-backlog")
    try:
        async with Client(parts.redis_url, prefix="chaos-backlog") as client:
            started = time.monotonic()
            ids = await submit(client, jobs, "backlog")
            results = await client.wait_many(ids, timeout=600)
            return {**await outcome(client, ids, results), "seconds": round(time.monotonic() - started, 1)}
    finally:
        worker.stop()


async def redis_restart(parts: Parts, jobs: int) -> dict[str, Any]:
    worker = parts.worker("chaos-redis", "worker-redis")
    try:
        async with Client(parts.redis_url, prefix="chaos-redis") as client:
            ids = await submit(client, jobs, "redis")
            await asyncio.sleep(1.5)  # mid-run; and what was accepted is fsynced (every second)
            parts.redis.kill()
            await asyncio.sleep(3.0)
            parts.redis.start()
            restarted = time.monotonic()
            results = await client.wait_many(ids, timeout=600)
            terminal_s = time.monotonic() - restarted
            counts = await outcome(client, ids, results)
        return {**counts, "terminal_s_after_restart": round(terminal_s, 1), "same_worker": worker.alive()}
    finally:
        worker.stop()


async def scenarios(parts: Parts, jobs: int, n_kills: int) -> dict[str, Any]:
    out = {"backlog": await backlog(parts, jobs)}
    parts.triton.set_exec_ms(KILL_EXEC_MS)
    await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s
    out["no_fault"] = await chaos_kills.kills(parts, jobs, 0, "chaos-calm")
    out["kills"] = await chaos_kills.kills(parts, jobs, n_kills, "chaos-kills")
    out["no_fault_one"] = await chaos_kills.kills(parts, jobs, 0, "chaos-calm1", n_workers=1)
    out["kills_one"] = await chaos_kills.kills(parts, jobs, n_kills, "chaos-kills1", n_workers=1)
    out["slowdown"] = await chaos_slow.slowdown(parts, jobs // 2, KILL_EXEC_MS)
    out["cpu_hog"] = await chaos_slow.hogged(parts, jobs // 2, KILL_EXEC_MS)
    parts.triton.set_exec_ms(EXEC_MS)
    await asyncio.sleep(0.7)
    out["startup"] = await chaos_kills.startup(parts)
    out["redis"] = await redis_restart(parts, jobs // 2)
    return out


def measure(jobs: int = 10_000, n_kills: int = 20) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="overspill-bench-chaos-"))
    port = free_port()
    redis = redis_process(port, run_dir, appendonly=True).start()
    triton = None
    try:
        triton = start_triton(run_dir, models=["fixed_cost"])
        triton.set_exec_ms(EXEC_MS)
        time.sleep(0.7)  # the model re-reads its cost within 0.5 s
        env = {
            "OVERSPILL_REDIS_URL": f"redis://127.0.0.1:{port}/0",
            "OVERSPILL_TRITON_URL": triton.grpc_url,
            "OVERSPILL_TRITON_METRICS_URL": triton.metrics_url,
            "OVERSPILL_METRICS_PORT": "0",
            "OVERSPILL_LOG_LEVEL": "WARNING",
        }
        parts = Parts(run_dir, redis, env["OVERSPILL_REDIS_URL"], env, triton)
        details = asyncio.run(scenarios(parts, jobs, n_kills))
    finally:
        if triton is not None:
            triton.stop()
        redis.stop()
    kill, calm = details["kills"], details["no_fault"]
    slow, hog = details["slowdown"], details["cpu_hog"]
    return {
        "command": "python -m bench chaos",
        "exec_ms": EXEC_MS,
        "kill_exec_ms": KILL_EXEC_MS,
        "chaos_mean_attempts_backlog": details["backlog"]["mean_attempts"],
        "chaos_goodput_vs_nofault": round(calm["seconds"] / kill["seconds"], 2),
        "chaos_goodput_one_worker": round(
            details["no_fault_one"]["seconds"] / details["kills_one"]["seconds"], 2
        ),
        "chaos_lost_kills": kill["not_terminal"] + details["kills_one"]["not_terminal"],
        "chaos_double_writes_kills": kill["double_writes"] + details["kills_one"]["double_writes"],
        "chaos_redis_terminal_s": details["redis"]["terminal_s_after_restart"],
        "chaos_lost_redis": details["redis"]["not_terminal"],
        "chaos_slowdown_goodput": slow["goodput"],
        "chaos_slowdown_empty_timeouts": slow["empty_timeouts"],
        "chaos_lost_slowdown": slow["not_terminal"] + hog["not_terminal"],
        "chaos_cpu_hog_goodput": hog["goodput"],
        "chaos_cpu_hog_empty_timeouts": hog["empty_timeouts"],
        "chaos_kill_to_reclaim_s": p99(kill["kill_to_reclaim_s"]),
        "worker_start_to_first_result_s": round(statistics.median(details["startup"]["first_result_s"]), 2),
        "details": details,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(jobs: int = 10_000, n_kills: int = 20, *, bulk: bool = False) -> dict[str, Any]:
    """The runs on the interactive lane (``chaos.json``), or with ``bulk`` on the bulk lane, whose
    chunks the worker runs as blocks (``chaos_bulk.json``, its keys named ``chaos_bulk_*``)."""
    if not bulk:
        return save_standalone("chaos", measure(jobs, n_kills))
    chaos_parts.LANE = "bulk"
    result = measure(jobs, n_kills)
    renamed = {
        k.replace("chaos_", "chaos_bulk_", 1) if k.startswith("chaos_") else k: v for k, v in result.items()
    }
    return save_standalone("chaos_bulk", renamed)


def bulk_section(c: dict[str, Any]) -> list[str]:
    """docs/benchmarks.md's lines for ``chaos_bulk.json`` (bench/report.py adds them when it exists)."""
    rows = [(k, v) for k, v in c.items() if k.startswith("chaos_bulk_")]
    return [
        "## Chaos on the bulk lane: chunks run as blocks",
        "",
        f"Command: `{c['command']}` (measured {c['measured_at']}): the runs of `bench chaos` with every job "
        "submitted on the bulk lane, so each thousand jobs are four chunks the worker runs as blocks. "
        "Lost jobs are those not terminal at the end; a job written twice would count twice in its "
        "chunk's `d`:",
        "",
        "| key | value |",
        "|---|---|",
        *[f"| `{k}` | {v} |" for k, v in rows],
        "",
    ]
