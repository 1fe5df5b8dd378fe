"""``python -m bench scale``: Triton replicas and a rolling restart, every job counted.

- ``scale_2_replicas_vs_1``: items/s through the worker's Triton backend (``TritonBackend``,
  the path its batchers use) over two fixed_cost replicas divided by over one. Each execution
  sleeps 50 ms (not CPU), 16 callers send 32-item requests, so a replica is the limit.
- ``scale_rolling_restart_failed``: two workers over both replicas run a stream of jobs while
  each in turn gets SIGTERM and is started again; jobs failed plus jobs never terminal (must be 0).

Writes ``bench/results/scale.json`` and merges the ``scale_*`` keys into ``latest.json``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from producer import Client
from stack.processes import ManagedProcess, free_port, python_process, redis_process, triton_process
from workers.errors import BackendUnavailable
from workers.local import TritonBackend

from .runner import RESULTS_DIR

MODEL = "fixed_cost"


def _replica(run_dir: Path) -> tuple[str, ManagedProcess]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    ms_file = run_dir / f"scale_ms-{grpc}"
    ms_file.write_text("50")
    proc = triton_process(
        run_dir, http_port=http, grpc_port=grpc, metrics_port=metrics, models=[MODEL],
        extra_env={"FIXED_COST_MS_FILE": str(ms_file)},
    ).start(wait=False)  # fmt: skip
    return f"127.0.0.1:{grpc}", proc


async def _items_per_s(url: str, seconds: float = 5.0) -> float:
    backend = TritonBackend(url)
    done = 0
    end = time.monotonic() + seconds
    texts = [f"t{i}" for i in range(32)]

    async def caller() -> None:
        nonlocal done
        while time.monotonic() < end:
            try:
                served = len(await backend.embed(MODEL, texts))
                done += served  # after the await: `done += await …` would read done before it
            except BackendUnavailable:
                pass  # not counted: a failure must lower the figure

    try:
        await asyncio.gather(*(caller() for _ in range(16)))
    finally:
        await backend.aclose()
    return done / seconds


def _worker(run_dir: Path, redis_url: str, urls: str, name: str) -> ManagedProcess:
    env = {
        "OVERSPILL_REDIS_URL": redis_url,
        "OVERSPILL_PREFIX": "scale",
        "OVERSPILL_TRITON_URLS": urls,
        "OVERSPILL_GATEWAY_MODE": "triton",
        "OVERSPILL_SHUTDOWN_GRACE_S": "2",
        "OVERSPILL_LOG_LEVEL": "INFO",
    }
    return python_process("worker", "workers", run_dir, env, log_name=f"scale-worker-{name}").start()


async def _rolling_restart(run_dir: Path, redis_url: str, urls: str, jobs: int = 6000) -> dict[str, int]:
    workers = [_worker(run_dir, redis_url, urls, f"{i}-0") for i in range(2)]
    ids: list[str] = []
    try:
        async with Client(redis_url, prefix="scale") as client:
            await asyncio.sleep(3)  # both workers polling

            async def produce() -> None:
                for n in range(0, jobs, 200):  # a steady stream, bounded in count
                    batch = [("embed", {"model": "fixed-cost", "input": f"r{i}"}) for i in range(n, n + 200)]
                    ids.extend(await client.submit_many(batch))
                    await asyncio.sleep(0.1)

            producing = asyncio.create_task(produce())
            for i in range(2):  # one at a time: SIGTERM, wait for its exit, start it again
                await asyncio.sleep(1.5)
                assert workers[i].proc is not None
                workers[i].proc.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 20
                while workers[i].poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                workers[i] = _worker(run_dir, redis_url, urls, f"{i}-1")
            await producing
            results = await client.wait_many(ids, timeout=120)
    finally:
        for w in workers:
            w.stop()
    statuses = [r.status for r in results]
    return {
        "jobs": len(ids),
        "failed": len(ids) - statuses.count("succeeded"),
        "succeeded": statuses.count("succeeded"),
    }


def measure() -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="overspill-scale-"))
    (a, pa), (b, pb) = _replica(run_dir), _replica(run_dir)
    port = free_port()
    redis = redis_process(port, run_dir, appendonly=False).start()
    try:
        for p in (pa, pb):
            p.wait_ready(120)
        one = asyncio.run(_items_per_s(a))
        two = asyncio.run(_items_per_s(f"{a},{b}"))
        rolling = asyncio.run(_rolling_restart(run_dir, f"redis://127.0.0.1:{port}/0", f"{a},{b}"))
    finally:
        for p in (pa, pb, redis):
            p.stop()
    return {
        "scale_2_replicas_vs_1": round(two / one, 2),
        "scale_rolling_restart_failed": rolling["failed"],
        "details": {"items_per_s_one": round(one), "items_per_s_two": round(two), "rolling_restart": rolling},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> dict[str, Any]:
    result = measure()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
    latest = RESULTS_DIR / "latest.json"
    if latest.exists():  # the headline keys travel with the last full run's figures
        merged = json.loads(latest.read_text())
        merged.update({k: v for k, v in result.items() if k.startswith("scale_")})
        latest.write_text(json.dumps(merged, indent=2) + "\n")
    return result


def section(c: dict[str, Any]) -> list[str]:
    """The docs/benchmarks.md section of a scale run (bench/report.py adds it when scale.json exists)."""
    d = c["details"]
    rolling = d["rolling_restart"]
    return [
        "## Scale: two Triton replicas, and a rolling restart", "",
        f"Command: `python -m bench scale` (two tritonservers with `fixed_cost` at 50 ms per execution; "
        f"measured {c['measured_at']}).", "",
        f"- Through the worker's Triton backend (16 callers of 32-item requests): one replica "
        f"{d['items_per_s_one']:,} items/s, two replicas {d['items_per_s_two']:,} items/s: "
        f"**{c['scale_2_replicas_vs_1']}×**.",
        f"- Rolling restart (SIGTERM, start again) of both workers, one at a time, under a stream of "
        f"{rolling['jobs']:,} jobs: {rolling['succeeded']:,} succeeded, "
        f"**{c['scale_rolling_restart_failed']} failed or never terminal**.", "",
    ]  # fmt: skip
