"""What every ``bench chaos`` scenario uses: the running parts, submitting, and counting outcomes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producer import Client, JobResult
from producer.contract import chunk_of
from stack.processes import ManagedProcess, python_process

MODEL = "fixed-cost"


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


TENANTS = 3  # the jobs of a run belong to this many tenants, so the lanes' fair share is exercised
# The lane every run submits to: "bulk" (``python -m bench chaos --bulk``) writes chunks, which the
# worker runs as blocks (workers/blocks/).
LANE = "interactive"


async def submit(client: Client, n: int, tag: str) -> list[str]:
    """``n`` jobs, a thousand per call, the calls' tenants in turn."""
    ids: list[str] = []
    for start in range(0, n, 1000):
        batch = [
            ("embed", {"model": MODEL, "input": f"{tag} {i}"}) for i in range(start, min(n, start + 1000))
        ]
        ids += await client.submit_many(batch, tenant=f"tenant-{start // 1000 % TENANTS}", lane=LANE)
    return ids


async def outcome(client: Client, ids: list[str], results: list[JobResult]) -> dict[str, Any]:
    """Counts of one run: how jobs ended, attempts, and how many results were written twice."""
    statuses = [r.status.value for r in results]
    plain = [i for i in ids if chunk_of(i) is None]
    markers = [await client.redis.llen(client.keys.done(i)) for i in plain]
    doubles = sum(m > 1 for m in markers) + await chunk_double_writes(client, ids, results)
    return {
        "jobs": len(ids),
        "succeeded": statuses.count("succeeded"),
        "not_terminal": len(ids)
        - sum(s in ("succeeded", "failed", "cancelled", "expired") for s in statuses),
        "double_writes": doubles,
        "mean_attempts": round(sum(r.attempts for r in results) / len(results), 3),
        "max_attempts": max(r.attempts for r in results),
    }


async def chunk_double_writes(client: Client, ids: list[str], results: list[JobResult]) -> int:
    """Results of jobs of chunks written more than once: each terminal write of a chunk's job
    adds one to its record's ``d``, so ``d`` past the chunk's terminal jobs counts the extra."""
    terminal: dict[str, int] = {}
    for job_id, result in zip(ids, results, strict=True):
        located = chunk_of(job_id)
        if located is not None:
            done = result.status.value not in ("queued", "running")
            terminal[located[0]] = terminal.get(located[0], 0) + done
    extra = 0
    for chunk_id, done in terminal.items():
        written = int(await client.redis.hget(client.keys.chunk(chunk_id), "d") or 0)
        extra += max(0, written - done)
    return extra


def steady_rate(finished: list[float]) -> float:
    """Items/s between the first and the last result of a phase: results come back a batch at a
    time, so the first batch's items mark the start and are not counted (no edge effects)."""
    times = sorted(finished)
    if len(times) < 2 or times[-1] - times[0] <= 0:
        return 0.0
    first_batch = sum(1 for t in times if t - times[0] < 0.05)
    return (len(times) - first_batch) / (times[-1] - times[0])


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
