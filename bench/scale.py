"""``python -m bench scale``: Triton replicas and a rolling restart, every job counted.

- ``scale_2_replicas_vs_1``: items/s through the worker's Triton backend (``TritonBackend``,
  the path its batchers use) over two fixed_cost replicas divided by over one. Each execution
  sleeps 50 ms (not CPU), 16 callers send 32-item requests, so a replica is the limit.
  ``scale_2_replicas_vs_1_at_5ms``: the same at 5 ms per execution.
- ``scale_2_replicas_vs_1_queue_5ms``: the same comparison through the whole queue path at 5 ms
  per execution: two worker processes over one replica, then over both, running a bulk
  ``submit_many`` + ``wait_many`` of single-text jobs from this process.
- ``scale_rolling_restart_failed``: two workers over both replicas and two API processes take a
  stream of jobs submitted over HTTP (through ``stack.balancer``, as behind a load balancer)
  while each of the four in turn gets SIGTERM and is started again; submissions not accepted
  plus jobs failed or never terminal (must be 0).

Writes ``bench/results/scale.json`` and merges the ``scale_*`` keys into ``latest.json``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from producer import Client
from producer.contract import hash_api_key
from stack.balancer import Balancer
from stack.processes import ManagedProcess, free_port, python_process, redis_process, triton_process
from workers.backends.local import TritonBackend
from workers.core import BackendUnavailable

from . import load
from .runner import save_standalone

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


QUEUE_ITEMS = 24_000
QUEUE_WORKERS = 2  # the two worker hosts


async def _queue_items_per_s(run_dir: Path, redis_url: str, urls: str, name: str) -> float:
    """Bulk items/s through Redis and ``QUEUE_WORKERS`` worker processes over the replicas in
    ``urls`` (P1's load: ``load.bulk``)."""
    workers = [_worker(run_dir, redis_url, urls, f"{name}-{i}") for i in range(QUEUE_WORKERS)]
    try:
        async with Client(redis_url, prefix="scale") as client:
            await load.bulk(client, "fixed-cost", 1000, timeout_s=60)  # warm: the workers are polling
            run = await load.bulk(client, "fixed-cost", QUEUE_ITEMS, timeout_s=120)
    finally:
        for worker in workers:
            worker.stop()
    return run.rate  # items that succeeded: a failure lowers the figure


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


def _api(run_dir: Path, redis_url: str, port: int, tenants: Path, name: str) -> ManagedProcess:
    env = {
        "OVERSPILL_REDIS_URL": redis_url,
        "OVERSPILL_PREFIX": "scale",
        "OVERSPILL_PORT": str(port),
        "OVERSPILL_TENANTS_FILE": str(tenants),
        "OVERSPILL_SHUTDOWN_DRAIN_S": "1",  # longer than the balancer's health-check period
    }
    ready = f"http://127.0.0.1:{port}/healthz"
    return python_process(
        "api", "producer.api", run_dir, env, ready_url=ready, log_name=f"scale-api-{name}"
    ).start()


async def _rolling_restart(
    run_dir: Path, redis_url: str, urls: str, max_jobs: int = 20_000
) -> dict[str, Any]:
    key = "osk_" + secrets.token_urlsafe(24)
    tenants = run_dir / "scale-tenants.json"
    tenant = {"name": "load", "api_key_sha256": [hash_api_key(key)], "rate_per_s": 100_000, "burst": 100_000}
    tenants.write_text(json.dumps({"tenants": [tenant]}))
    workers = [_worker(run_dir, redis_url, urls, f"{i}-0") for i in range(2)]
    ports = [free_port(), free_port()]
    apis = [_api(run_dir, redis_url, p, tenants, f"{i}-0") for i, p in enumerate(ports)]
    ids: list[str | None] = []
    exits: dict[str, int | None] = {}
    submitters = 16
    try:
        lb = Balancer([f"http://127.0.0.1:{p}" for p in ports], headers={"Authorization": f"Bearer {key}"})
        async with lb, Client(redis_url, prefix="scale") as client:
            await asyncio.sleep(3)  # both workers polling

            restarted = asyncio.Event()

            async def produce(k: int) -> None:
                # A steady stream until every process has restarted, bounded in count.
                for i in range(k, max_jobs, submitters):
                    if restarted.is_set():
                        return
                    body = {"model": "fixed-cost", "input": f"r{i}"}
                    ids.append(await lb.submit("embed", body, key=f"rolling-{i}"))

            producing = asyncio.gather(*(produce(k) for k in range(submitters)))
            for i in range(2):  # one at a time: SIGTERM, wait for its exit, start it again
                await asyncio.sleep(1.5)
                exits[f"worker{i}"] = await workers[i].terminated(20.0)
                workers[i] = _worker(run_dir, redis_url, urls, f"{i}-1")
            for i in range(2):
                await asyncio.sleep(1.5)
                exits[f"api{i}"] = await apis[i].terminated(20.0)
                apis[i] = _api(run_dir, redis_url, ports[i], tenants, f"{i}-1")
            await asyncio.sleep(1.0)  # load on the restarted API too
            restarted.set()
            await producing
            accepted = [i for i in ids if i is not None]
            results = await client.wait_many(accepted, timeout=120)
    finally:
        for p in (*workers, *apis):
            p.stop()
    succeeded = [r.status for r in results].count("succeeded")
    return {
        "jobs": len(ids),
        "failed": len(ids) - succeeded,  # never accepted, failed, or never terminal
        "succeeded": succeeded,
        "moved": lb.stats.moved,
        "exits": exits,
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
        for ms_file in run_dir.glob("scale_ms-*"):  # the same at 5 ms per execution
            ms_file.write_text("5")
        time.sleep(1.0)  # the model re-reads its file at most every 0.5 s
        one_5 = asyncio.run(_items_per_s(a))
        two_5 = asyncio.run(_items_per_s(f"{a},{b}"))
        redis_url = f"redis://127.0.0.1:{port}/0"
        queue_one = asyncio.run(_queue_items_per_s(run_dir, redis_url, a, "q1"))
        queue_two = asyncio.run(_queue_items_per_s(run_dir, redis_url, f"{a},{b}", "q2"))
        for ms_file in run_dir.glob("scale_ms-*"):
            ms_file.write_text("50")
        time.sleep(1.0)
        rolling = asyncio.run(_rolling_restart(run_dir, redis_url, f"{a},{b}"))
    finally:
        for p in (pa, pb, redis):
            p.stop()
    return {
        "scale_2_replicas_vs_1": round(two / one, 2),
        "scale_2_replicas_vs_1_at_5ms": round(two_5 / one_5, 2),
        "scale_2_replicas_vs_1_queue_5ms": round(queue_two / queue_one, 2),
        "scale_rolling_restart_failed": rolling["failed"],
        "details": {
            "items_per_s_one": round(one),
            "items_per_s_two": round(two),
            "items_per_s_one_5ms": round(one_5),
            "items_per_s_two_5ms": round(two_5),
            "queue_items_per_s_one_5ms": round(queue_one),
            "queue_items_per_s_two_5ms": round(queue_two),
            "rolling_restart": rolling,
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> dict[str, Any]:
    return save_standalone("scale", measure())


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
        f"**{c['scale_2_replicas_vs_1']}×**."
        + (f" At 5 ms per execution: {d['items_per_s_one_5ms']:,} vs {d['items_per_s_two_5ms']:,} items/s, "
           f"**{c['scale_2_replicas_vs_1_at_5ms']}×**: the balancing layer's figure."
           if "scale_2_replicas_vs_1_at_5ms" in c else ""),
        *([f"- Through the whole queue path at 5 ms per execution ({QUEUE_WORKERS} worker processes, a bulk "
           f"`submit_many` + `wait_many` of {QUEUE_ITEMS:,} single-text jobs): one replica "
           f"{d['queue_items_per_s_one_5ms']:,} items/s, two {d['queue_items_per_s_two_5ms']:,}: "
           f"**{c['scale_2_replicas_vs_1_queue_5ms']}×**. On 2 cores the queue's own CPU, not the "
           "replicas, bounds the second figure (see \"What limits each figure\" above)."]
          if "scale_2_replicas_vs_1_queue_5ms" in c else []),
        f"- Rolling restart (SIGTERM, start again) of both workers and both API processes, one at a "
        f"time, under a stream of {rolling['jobs']:,} jobs submitted over HTTP behind a client-side "
        f"balancer: {rolling['succeeded']:,} succeeded, "
        f"**{c['scale_rolling_restart_failed']} failed or never terminal**; exit statuses "
        f"{rolling.get('exits', {})}.", "",
    ]  # fmt: skip
