"""``python -m bench chaos``: the system's promises under faults, counted job by job.

Starts its own redis-server (AOF, fsync every second), tritonserver (``fixed_cost`` only, slowed
to 50 ms per execution, about 1 300 items/s: a backend that is the limit, as a GPU is) and
worker processes with the default settings, on free loopback ports. Three runs:

- backlog: ``jobs`` jobs submitted at once, no fault → ``chaos_mean_attempts_backlog``;
- kills: ``jobs`` jobs with two workers, one of them SIGKILLed every 2 s while work is left,
  ``kills`` times at most (a new one started each time, as an orchestrator would), against the
  same run without kills →
  ``chaos_goodput_vs_nofault``, ``chaos_lost_kills``, ``chaos_double_writes_kills``;
- redis: Redis SIGKILLed mid-run and restarted on its port 3 s later, the same worker
  processes → ``chaos_redis_terminal_s`` (restart to every job terminal), ``chaos_lost_redis``.

Writes ``bench/results/chaos.json``; ``python -m bench report`` adds it to docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producer import Client, JobResult
from stack.processes import ManagedProcess, free_port, python_process, redis_process, start_triton

from .runner import RESULTS_DIR

MODEL = "fixed-cost"
EXEC_MS = 50.0
# The kill runs slow the model to about 210 items/s, so that 10 000 jobs take about 45 s and
# 20 kills 2 s apart land while work is left (the real embedding model here is about as fast).
KILL_EXEC_MS = 300.0


@dataclass
class Parts:
    run_dir: Path
    redis: ManagedProcess
    redis_url: str
    env: dict[str, str]
    triton: Any

    def worker(self, prefix: str, name: str) -> ManagedProcess:
        env = {**self.env, "OVERSPILL_PREFIX": prefix}
        return python_process("worker", "workers", self.run_dir, env, log_name=name).start()


async def submit(client: Client, n: int, tag: str) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, 1000):
        batch = [
            ("embed", {"model": MODEL, "input": f"{tag} {i}"}) for i in range(start, min(n, start + 1000))
        ]
        ids += await client.submit_many(batch)
    return ids


async def outcome(client: Client, ids: list[str], results: list[JobResult]) -> dict[str, Any]:
    """Counts of one run: how jobs ended, attempts, and how many results were written twice."""
    markers = [await client.redis.llen(client.keys.done(i)) for i in ids]
    statuses = [r.status.value for r in results]
    return {
        "jobs": len(ids),
        "succeeded": statuses.count("succeeded"),
        "not_terminal": len(ids)
        - sum(s in ("succeeded", "failed", "cancelled", "expired") for s in statuses),
        "double_writes": sum(m > 1 for m in markers),
        "mean_attempts": round(sum(r.attempts for r in results) / len(results), 3),
        "max_attempts": max(r.attempts for r in results),
    }


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


async def kills(parts: Parts, jobs: int, kills: int, prefix: str) -> dict[str, Any]:
    workers = [parts.worker(prefix, f"worker-{prefix}-0"), parts.worker(prefix, f"worker-{prefix}-1")]
    started_workers = 2
    try:
        async with Client(parts.redis_url, prefix=prefix) as client:
            started = time.monotonic()
            ids = await submit(client, jobs, prefix)
            waiter = asyncio.create_task(client.wait_many(ids, timeout=600))
            done_kills = 0
            while done_kills < kills:  # every 2 s while work is left, at most ``kills`` times
                await asyncio.wait({waiter}, timeout=2.0)
                if waiter.done():
                    break
                workers[done_kills % 2].kill()
                workers[done_kills % 2] = parts.worker(prefix, f"worker-{prefix}-{started_workers}")
                started_workers += 1
                done_kills += 1
            results = await waiter
            took = time.monotonic() - started
            return {**await outcome(client, ids, results), "seconds": round(took, 1), "kills": done_kills}
    finally:
        for w in workers:
            w.stop()


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
    out["no_fault"] = await kills(parts, jobs, 0, "chaos-calm")
    out["kills"] = await kills(parts, jobs, n_kills, "chaos-kills")
    parts.triton.set_exec_ms(EXEC_MS)
    await asyncio.sleep(0.7)
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
    return {
        "command": "python -m bench chaos",
        "exec_ms": EXEC_MS,
        "kill_exec_ms": KILL_EXEC_MS,
        "chaos_mean_attempts_backlog": details["backlog"]["mean_attempts"],
        "chaos_goodput_vs_nofault": round(calm["seconds"] / kill["seconds"], 2),
        "chaos_lost_kills": kill["not_terminal"],
        "chaos_double_writes_kills": kill["double_writes"],
        "chaos_redis_terminal_s": details["redis"]["terminal_s_after_restart"],
        "chaos_lost_redis": details["redis"]["not_terminal"],
        "details": details,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(jobs: int = 10_000, n_kills: int = 20) -> dict[str, Any]:
    result = measure(jobs, n_kills)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "chaos.json").write_text(json.dumps(result, indent=2) + "\n")
    latest = RESULTS_DIR / "latest.json"
    if latest.exists():  # the headline keys travel with the last full run's figures too
        merged = json.loads(latest.read_text())
        merged.update({k: v for k, v in result.items() if k.startswith("chaos_")})
        latest.write_text(json.dumps(merged, indent=2) + "\n")
    return result
