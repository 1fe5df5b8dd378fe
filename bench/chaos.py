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
  processes → ``chaos_redis_terminal_s`` (restart to every job terminal), ``chaos_lost_redis``;
- slowdown: the model's cost raised 5× mid-run (300 → 1 500 ms per execution) for 15 s, then
  back, with a 5 s time limit (shorter than a request's wait in Triton's queue while slow) →
  ``chaos_slowdown_goodput`` (items/s while slow ÷ the slowed model's items/s measured
  directly) and ``chaos_slowdown_empty_timeouts`` (packages timed out with nothing kept);
- recovery: in the kills run, each kill to the first package of the killed worker run again
  elsewhere (its lease, ``package_lease_s`` 5 s, runs out first) → ``chaos_kill_to_reclaim_s``
  (p99); and a worker process started with work queued to that work's first result →
  ``worker_start_to_first_result_s`` (median of 3), beside the time its imports take.

Writes ``bench/results/chaos.json``; ``python -m bench report`` adds it to docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arq.constants import in_progress_key_prefix

from producer import Client, JobResult
from stack.processes import ManagedProcess, free_port, python_process, redis_process, start_triton

from . import direct
from .runner import RESULTS_DIR

MODEL = "fixed-cost"
EXEC_MS = 50.0
# The kill runs slow the model to about 210 items/s, so that 10 000 jobs take about 45 s and
# 20 kills 2 s apart land while work is left (the real embedding model here is about as fast).
KILL_EXEC_MS = 300.0
SLOW_FACTOR = 5.0
SLOW_S = 15.0
SLOW_TIME_LIMIT_S = 5.0  # OVERSPILL_JOB_TIMEOUT_S of the slowdown run: a request waits 6 s when slow


@dataclass
class Parts:
    run_dir: Path
    redis: ManagedProcess
    redis_url: str
    env: dict[str, str]
    triton: Any

    def worker(self, prefix: str, name: str, **settings: str) -> ManagedProcess:
        env = {**self.env, "OVERSPILL_PREFIX": prefix, **settings}
        return python_process("worker", "workers", self.run_dir, env, log_name=name).start()

    def events(self, name: str, event: str) -> list[dict[str, Any]]:
        """The worker log's JSON lines whose event is ``event``."""
        lines = (self.run_dir / f"{name}.log").read_text(errors="replace").splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{")]
        return [r for r in records if r.get("event") == event]


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
            killed: list[tuple[float, set[str]]] = []  # when, and the packages in progress then
            while done_kills < kills:  # every 2 s while work is left, at most ``kills`` times
                await asyncio.wait({waiter}, timeout=2.0)
                if waiter.done():
                    break
                keys = await client.redis.keys(in_progress_key_prefix + "*")
                held = {
                    (k.decode() if isinstance(k, bytes) else k).removeprefix(in_progress_key_prefix)
                    for k in keys
                }
                killed.append((time.time(), held))
                workers[done_kills % 2].kill()
                workers[done_kills % 2] = parts.worker(prefix, f"worker-{prefix}-{started_workers}")
                started_workers += 1
                done_kills += 1
            results = await waiter
            took = time.monotonic() - started
            names = [f"worker-{prefix}-{i}" for i in range(started_workers)]
            reclaim = reclaim_s(killed, [e for n in names for e in parts.events(n, RERUN_EVENT)])
            return {
                **await outcome(client, ids, results),
                "seconds": round(took, 1),
                "kills": done_kills,
                "kill_to_reclaim_s": reclaim,
            }
    finally:
        for w in workers:
            w.stop()


RERUN_EVENT = "package re-run split to isolate a crash"  # a dead worker's package run again


def reclaim_s(killed: list[tuple[float, set[str]]], reruns: list[dict[str, Any]]) -> list[float]:
    """Per kill, seconds to the first re-run of a package claimed since the kill before and in
    progress at this one: the dead worker's come back as re-runs, the other worker's finish
    (or come back only after its own kill, later). A kill with none is skipped."""
    runs = [(dt.datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp(), e.get("package_id"))
            for e in reruns]  # fmt: skip
    out = []
    seen: set[str] = set()  # in progress at an earlier kill: an earlier victim's, or older work
    for at, held in killed:
        new = held - seen
        seen |= held
        after = [t for t, package in runs if t >= at and package in new]
        if after:
            out.append(round(min(after) - at, 2))
    return out


async def startup(parts: Parts, runs: int = 3) -> dict[str, Any]:
    """A worker started with work queued: seconds from its launch to that work's first result."""
    firsts = []
    for n in range(runs):
        prefix = f"chaos-start-{n}"
        async with Client(parts.redis_url, prefix=prefix) as client:
            ids = await submit(client, 32, prefix)
            launched = time.time()
            worker = parts.worker(prefix, f"worker-start-{n}")
            try:
                results = await client.wait_many(ids, timeout=60)
            finally:
                worker.stop()
        firsts.append(min(r.finished_at or launched for r in results) - launched)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import workers.app.main"], check=True)
    return {
        "first_result_s": [round(s, 2) for s in firsts],
        "imports_s": round(time.perf_counter() - started, 2),
    }


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


def steady_rate(finished: list[float]) -> float:
    """Items/s between the first and the last result of a phase: results come back a batch at a
    time, so the first batch's items mark the start and are not counted (no edge effects)."""
    times = sorted(finished)
    if len(times) < 2 or times[-1] - times[0] <= 0:
        return 0.0
    first_batch = sum(1 for t in times if t - times[0] < 0.05)
    return (len(times) - first_batch) / (times[-1] - times[0])


async def slowdown(parts: Parts, jobs: int) -> dict[str, Any]:
    """Goodput while the backend is 5× slower, against the slowed model's direct rate."""
    slow_ms = KILL_EXEC_MS * SLOW_FACTOR
    parts.triton.set_exec_ms(slow_ms)
    await asyncio.sleep(0.7)
    direct_run = await direct.batched(parts.triton.grpc_url, "fixed_cost", 64 * 12, 4, timeout_s=120)
    parts.triton.set_exec_ms(KILL_EXEC_MS)
    await asyncio.sleep(0.7)
    worker = parts.worker("chaos-slow", "worker-slow", OVERSPILL_JOB_TIMEOUT_S=str(SLOW_TIME_LIMIT_S))
    try:
        async with Client(parts.redis_url, prefix="chaos-slow") as client:
            started = time.monotonic()
            ids = await submit(client, jobs, "slow")
            waiter = asyncio.create_task(client.wait_many(ids, timeout=600))
            await asyncio.sleep(3.0)
            parts.triton.set_exec_ms(slow_ms)
            slow_from = time.time() + 0.5  # the model re-reads its cost within 0.5 s
            await asyncio.sleep(SLOW_S)
            parts.triton.set_exec_ms(KILL_EXEC_MS)
            slow_to = time.time()
            results = await waiter
            seconds = time.monotonic() - started
            counts = await outcome(client, ids, results)
    finally:
        worker.stop()
    rate = steady_rate(
        [r.finished_at for r in results if r.finished_at and slow_from <= r.finished_at <= slow_to]
    )
    timeouts = parts.events("worker-slow", "package timed out, re-queued")
    return {
        **counts,
        "seconds": round(seconds, 1),
        "slow_exec_ms": slow_ms,
        "time_limit_s": SLOW_TIME_LIMIT_S,
        "slow_items_s": round(rate, 1),
        "direct_slow_items_s": round(direct_run.rate, 1),
        "goodput": round(rate / direct_run.rate, 2),
        "timeouts": len(timeouts),
        "empty_timeouts": sum(1 for e in timeouts if e.get("kept") == 0),
    }


async def scenarios(parts: Parts, jobs: int, n_kills: int) -> dict[str, Any]:
    out = {"backlog": await backlog(parts, jobs)}
    parts.triton.set_exec_ms(KILL_EXEC_MS)
    await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s
    out["no_fault"] = await kills(parts, jobs, 0, "chaos-calm")
    out["kills"] = await kills(parts, jobs, n_kills, "chaos-kills")
    out["slowdown"] = await slowdown(parts, jobs // 2)
    parts.triton.set_exec_ms(EXEC_MS)
    await asyncio.sleep(0.7)
    out["startup"] = await startup(parts)
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
        "chaos_slowdown_goodput": details["slowdown"]["goodput"],
        "chaos_slowdown_empty_timeouts": details["slowdown"]["empty_timeouts"],
        "chaos_lost_slowdown": details["slowdown"]["not_terminal"],
        "chaos_kill_to_reclaim_s": p99(kill["kill_to_reclaim_s"]),
        "worker_start_to_first_result_s": round(statistics.median(details["startup"]["first_result_s"]), 2),
        "details": details,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


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
