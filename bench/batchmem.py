"""``python -m bench batchmem``: peak Redis memory while a 50 000-line embedding batch runs.

Starts the bench servers (Redis, Triton with ``fixed_cost``), one worker, and runs the batch
straight through Redis (``overspill bulk``'s Redis backend: upload, create, step until done).
``INFO memory`` ``used_memory`` is sampled every 50 ms; the figure is the peak above the
memory before the batch. Writes ``batch_peak_redis_mib_50k`` into ``bench/results/latest.json``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from producer.batches import BatchSettings
from producer.batches.bulk import RedisBackend

from .harness import FIXED, Harness
from .runner import RESULTS_DIR

PREFIX = "bench-batchmem"
SAMPLE_S = 0.05


def input_file(path: Path, lines: int) -> None:
    with path.open("w") as f:
        for i in range(lines):
            body = {"model": FIXED, "input": f"nightly line {i} of the batch"}
            f.write(
                json.dumps({"custom_id": f"r-{i}", "method": "POST", "url": "/v1/embeddings", "body": body})
            )
            f.write("\n")


async def sample_peak(url: str, stop: asyncio.Event, into: list[int]) -> None:
    async with aioredis.Redis.from_url(url) as r:
        while not stop.is_set():
            into.append(int((await r.info("memory"))["used_memory"]))
            await asyncio.sleep(SAMPLE_S)


async def run_batch(h: Harness, source: Path, files_dir: Path) -> dict[str, Any]:
    settings = BatchSettings(redis_url=h.redis_url, prefix=PREFIX, files_dir=files_dir)
    backend = RedisBackend(settings, "default")
    async with aioredis.Redis.from_url(h.redis_url) as r:
        before = int((await r.info("memory"))["used_memory"])
    samples: list[int] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_peak(h.redis_url, stop, samples))
    started = time.perf_counter()
    try:
        file_id = await backend.upload(source)
        batch = await backend.create(file_id, "/v1/embeddings")
        while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
            await asyncio.sleep(settings.batch_poll_s)
            batch = await backend.poll(batch["id"])
    finally:
        stop.set()
        await sampler
        await backend.client.aclose()
    seconds = time.perf_counter() - started
    peak = max(samples, default=before)
    return {
        "status": batch["status"],
        "completed": batch["request_counts"]["completed"],
        "failed": batch["request_counts"]["failed"],
        "seconds": round(seconds, 1),
        "used_memory_before_mib": round(before / 2**20, 1),
        "peak_above_before_mib": round((peak - before) / 2**20, 1),
        "samples": len(samples),
    }


def main(lines: int = 50_000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="overspill-bench-batchmem-") as tmp, Harness.start() as h:
        source = Path(tmp) / "nightly.jsonl"
        input_file(source, lines)
        h.start_worker(PREFIX)
        run = asyncio.run(run_batch(h, source, Path(tmp) / "files"))
    result = {
        "command": "python -m bench batchmem",
        "lines": lines,
        "batch_peak_redis_mib_50k": run["peak_above_before_mib"],
        "details": run,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "batchmem.json").write_text(json.dumps(result, indent=2) + "\n")
    latest = RESULTS_DIR / "latest.json"
    if latest.exists():
        merged = json.loads(latest.read_text())
        merged["batch_peak_redis_mib_50k"] = result["batch_peak_redis_mib_50k"]
        latest.write_text(json.dumps(merged, indent=2) + "\n")
    return result
