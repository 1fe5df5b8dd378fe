"""``python -m bench.parquet``: a million-row Parquet of texts through ``overspill bulk``, beside
direct Triton, on a stack already running (the one ``overspill up`` starts; this module starts
nothing).

It writes ``--rows`` mixed-length texts (``bench/corpus.py``) as a Parquet table, runs the
README's table command (``overspill bulk in.parquet -o out.parquet --model fixed-cost``) as a
process of its own while it samples Redis's ``used_memory`` and the command's peak RSS every
0.2 s, checks the output (every row once, a 384-float vector each, no error), then
sends the same texts straight to Triton (64 per request, 4 in flight). Writes
``bench/results/parquet.json``; ``python -m bench report`` adds it to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import redis
import tritonclient.grpc.aio as grpc_aio

from .corpus import texts
from .direct import BATCH, _infer
from .harness import FIXED, TRITON_NAME
from .runner import save_standalone

ROWS = 1_000_000
SAMPLE_S = 0.2


class MemorySampler(threading.Thread):
    """Redis's ``used_memory``, the highest seen while it runs, and a process's peak RSS (its
    ``VmHWM``: not ``getrusage``, whose children's figure counts a child's RSS between fork
    and exec, the bench's own)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.redis = redis.Redis.from_url(url)
        self.peak = self.baseline = int(self.redis.info("memory")["used_memory"])
        self.done = threading.Event()
        self.pid = 0
        self.child_kb = 0

    def watch(self, pid: int) -> None:
        self.pid = pid

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            self.peak = max(self.peak, int(self.redis.info("memory")["used_memory"]))
            self.child_kb = max(self.child_kb, _peak_kb(self.pid))


def _peak_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(status.split("VmHWM:")[1].split()[0]) if "VmHWM:" in status else 0


def write_input(path: Path, rows: int) -> None:
    corpus = texts(rows)
    pq.write_table(
        pa.table({"id": [f"row-{i}" for i in range(rows)], "text": corpus}), path, row_group_size=65_536
    )


def run_bulk(source: Path, out: Path, redis_url: str, timeout_s: float) -> dict[str, Any]:
    """The README's table command, timed, with the child's peak RSS and Redis's peak memory."""
    sampler = MemorySampler(redis_url)
    sampler.start()
    env = {**os.environ, "OVERSPILL_REDIS_URL": redis_url}
    command = [sys.executable, "-m", "stack", "bulk", str(source), "-o", str(out), "--model", FIXED]
    command += ["--id-column", "id", "--text-column", "text"]
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler.watch(child.pid)
    try:
        _, stderr = child.communicate(timeout=timeout_s)
    finally:
        sampler.done.set()
        sampler.join()
    seconds = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"overspill bulk failed ({child.returncode}): {stderr[-2000:]}")
    return {
        "seconds": round(seconds, 2),
        "client_rss_mb": round(sampler.child_kb / 1024, 1),
        "redis_peak_mb": round(sampler.peak / 2**20, 1),
        "redis_baseline_mb": round(sampler.baseline / 2**20, 1),
    }


def check_output(out: Path, rows: int) -> dict[str, Any]:
    """Every input row exactly once, a vector each, no error."""
    table = pq.read_table(out, columns=["id", "embedding", "error"])
    ids = table.column("id").to_pylist()
    errors = sum(e is not None for e in table.column("error").to_pylist())
    dims = table.schema.field("embedding").type.list_size
    if len(ids) != rows or len(set(ids)) != rows:
        raise RuntimeError(f"{len(ids)} rows out ({len(set(ids))} distinct) for {rows} in")
    return {"rows_out": len(ids), "errors": errors, "dimensions": dims}


async def direct(triton: str, rows: int, concurrency: int = 4) -> float:
    """Seconds for the same texts straight to Triton, 64 per request."""
    corpus = texts(rows)
    batches = iter([corpus[i : i + BATCH] for i in range(0, rows, BATCH)])
    client = grpc_aio.InferenceServerClient(triton)

    async def lane() -> None:
        for batch in batches:
            await _infer(client, TRITON_NAME[FIXED], batch)

    try:
        await _infer(client, TRITON_NAME[FIXED], corpus[:BATCH])
        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        return time.perf_counter() - started
    finally:
        await client.close()


def main(redis_url: str, triton: str, rows: int, timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-parquet-") as tmp:
        source, out = Path(tmp) / "texts.parquet", Path(tmp) / "vectors.parquet"
        write_input(source, rows)
        bulk = run_bulk(source, out, redis_url, timeout_s)
        checked = check_output(out, rows)
    direct_s = asyncio.run(direct(triton, rows))
    return {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": f"python -m bench.parquet --rows {rows}",
        "rows": rows,
        "parquet_1m_client_rss_mb": bulk["client_rss_mb"],
        "parquet_1m_redis_peak_mb": round(bulk["redis_peak_mb"] - bulk["redis_baseline_mb"], 1),
        "parquet_1m_vs_direct": round(direct_s / bulk["seconds"], 3),
        "details": {
            **bulk,
            **checked,
            "bulk_rows_per_s": round(rows / bulk["seconds"], 1),
            "direct_seconds": round(direct_s, 2),
            "direct_rows_per_s": round(rows / direct_s, 1),
        },
    }


def section(p: dict[str, Any]) -> list[str]:
    """The docs/benchmarks.md section of a Parquet run (bench/report.py adds it when parquet.json exists)."""
    d = p["details"]
    return [
        "## A million-row Parquet through `overspill bulk`",
        "",
        f"Command: `{p['command']}` against `OVERSPILL_GATEWAY_MODE=triton overspill up` (measured "
        f"{p['measured_at']}; {p['rows']:,} mixed-length texts of `bench/corpus.py`, the fixed-cost model, "
        "1 worker). The README's table command runs as a process of its own; the same texts then go "
        "straight to Triton, 64 per request, 4 in flight:",
        "",
        "| figure | measured |",
        "|---|---|",
        f"| rows/s, `overspill bulk` (Parquet in, Parquet out) | {d['bulk_rows_per_s']:,} |",
        f"| rows/s, direct Triton | {d['direct_rows_per_s']:,} |",
        f"| `parquet_1m_vs_direct` | {p['parquet_1m_vs_direct']} |",
        f"| `parquet_1m_client_rss_mb` (the command's peak RSS) | {p['parquet_1m_client_rss_mb']} |",
        f"| `parquet_1m_redis_peak_mb` (Redis `used_memory` sampled every {SAMPLE_S} s: its peak "
        f"{d['redis_peak_mb']} less the {d['redis_baseline_mb']} it held before) | {p['parquet_1m_redis_peak_mb']} |",
        f"| rows out / errors | {d['rows_out']:,} / {d['errors']} |",
        "",
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.parquet", description=__doc__)
    parser.add_argument("--redis", default="redis://127.0.0.1:6380/0")
    parser.add_argument("--triton", default="127.0.0.1:8001", help="Triton's gRPC address")
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--timeout", type=float, default=1800.0)
    a = parser.parse_args()
    result = main(a.redis, a.triton, a.rows, a.timeout)
    save_standalone("parquet", result)  # results/parquet.json; its parquet_* keys into latest.json
    print(json.dumps({k: v for k, v in result.items() if k != "details"}))
