"""``python -m bench.columns``: bulk results as envelopes and as arrays, beside direct Triton, on a
stack already running (the one ``overspill up`` starts; this module starts nothing).

Start the stack first (``OVERSPILL_GATEWAY_MODE=triton .venv/bin/overspill up``; with
``FIXED_COST_MS_FILE=PATH`` set for it and ``--ms-file PATH`` here, a last phase sets the
fixed-cost model to 0 ms and measures the data plane alone: items/s per worker process). Each repetition
runs, one after the other on the same Triton: a direct batched ``tritonclient`` loop (64 per
request, 4 in flight), the README's bulk code with envelopes (``submit_many(lane="bulk")`` +
``iter_results``) and the same with arrays (``iter_arrays``). For each bulk pass it reads the CPU
this process (the client) and the stack's workers spent (from /proc), and Redis's own counters
(INFO commandstats and CPU), per item. Prints a JSON line per repetition and writes
``bench/results/columns.json`` (``python -m bench report`` adds it to docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis

from producer import Client
from producer.contract import DEFAULT_CHUNK_SIZE

from . import direct, load
from .cpu import cpu_s
from .harness import FIXED, TRITON_NAME
from .redis_cost import redis_counters
from .runner import save_standalone

ITEMS = 12_000
TIMEOUT_S = 300.0


def workers_of(redis_url: str) -> list[int]:
    """The pids of the worker processes serving ``redis_url`` (``python -m workers`` with it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            if cmd[-3:-1] != [b"-m", b"workers"]:
                continue
            env = dict(v.split(b"=", 1) for v in (proc / "environ").read_bytes().split(b"\0") if b"=" in v)
            if env.get(b"OVERSPILL_REDIS_URL", b"").decode() == redis_url:
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def _cpu(pids: list[int]) -> float:
    return sum(cpu_s(pid) for pid in pids)


def _redis(r: redis.Redis) -> tuple[float, int, float]:
    """Redis's CPU seconds, its calls (scripts' commands included) and the microseconds spent
    inside commands (``INFO commandstats``: the rest of its CPU is sockets, the event loop, the
    append-only file)."""
    cpu, calls = redis_counters(r)
    usec = sum(float(v["usec"]) for k, v in r.info("commandstats").items() if k != "cmdstat_info")
    return cpu, sum(n for command, n in calls.items() if command != "info"), usec


def at_rest(r: redis.Redis, seconds: float = 3.0) -> float:
    """Redis's CPU ms a second while the stack runs and nothing is submitted."""
    before = _redis(r)[0]
    time.sleep(seconds)
    return round((_redis(r)[0] - before) / seconds * 1000, 2)


async def _envelopes(client: Client, ids: list[str]) -> int:
    return sum([r.status == "succeeded" async for r in client.iter_results(ids, timeout=TIMEOUT_S)])


async def _arrays(client: Client, ids: list[str]) -> int:
    return sum([len(block) async for block in client.iter_arrays(ids, timeout=TIMEOUT_S)])


async def bulk_pass(
    client: Client,
    r: redis.Redis,
    workers: list[int],
    read: Callable[[Client, list[str]], Awaitable[int]],
) -> dict[str, float]:
    """One bulk pass of ``ITEMS`` texts: its rate and every process's cost per item."""
    texts = load.texts(ITEMS)
    redis0, calls0, usec0, workers0, client0 = *_redis(r), _cpu(workers), time.process_time()
    start = time.perf_counter()
    ids = await client.submit_many([("embed", load.body(FIXED, t)) for t in texts], lane="bulk")
    done = await read(client, ids)
    seconds = time.perf_counter() - start
    redis1, calls1, usec1 = _redis(r)
    assert done == ITEMS, f"{ITEMS - done} items did not succeed"
    return {
        "items_per_s": round(ITEMS / seconds, 1),
        "client_cpu_ms_per_item": round((time.process_time() - client0) / ITEMS * 1e3, 4),
        "worker_cpu_ms_per_item": round((_cpu(workers) - workers0) / ITEMS * 1e3, 4),
        "redis_cpu_us_per_item": round((redis1 - redis0) / ITEMS * 1e6, 1),
        "redis_commands_per_item": round((calls1 - calls0) / ITEMS, 3),
        "redis_command_us_per_item": round((usec1 - usec0) / ITEMS, 2),
    }


async def repetition(client: Client, r: redis.Redis, workers: list[int], triton: str) -> dict[str, Any]:
    rate = (await direct.batched(triton, TRITON_NAME[FIXED], ITEMS, 4, timeout_s=TIMEOUT_S)).rate
    envelopes = await bulk_pass(client, r, workers, _envelopes)
    arrays = await bulk_pass(client, r, workers, _arrays)
    return {
        "direct_items_per_s": round(rate, 1),
        "envelopes": envelopes,
        "arrays": arrays,
        "p1_bulk_vs_direct": round(envelopes["items_per_s"] / rate, 3),
        "p1_bulk_vs_direct_arrays": round(arrays["items_per_s"] / rate, 3),
    }


def summary(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and ranges of the headline keys, over the repetitions."""

    def pick(path: tuple[str, ...]) -> list[float]:
        out = []
        for rep in reps:
            value: Any = rep
            for key in path:
                value = value[key]
            out.append(float(value))
        return out

    keys = {
        "p1_bulk_vs_direct": ("p1_bulk_vs_direct",),
        "p1_bulk_vs_direct_arrays": ("p1_bulk_vs_direct_arrays",),
        "cpu_ms_per_item_bulk_client": ("envelopes", "client_cpu_ms_per_item"),
        "cpu_ms_per_item_bulk_client_arrays": ("arrays", "client_cpu_ms_per_item"),
        "cpu_ms_per_item_bulk_worker": ("arrays", "worker_cpu_ms_per_item"),
        "redis_cpu_us_per_item_bulk": ("arrays", "redis_cpu_us_per_item"),
        "redis_commands_per_item_bulk": ("arrays", "redis_commands_per_item"),
        "redis_command_us_per_item_bulk": ("arrays", "redis_command_us_per_item"),
    }
    out: dict[str, Any] = {}
    for name, path in keys.items():
        values = pick(path)
        out[name] = round(statistics.median(values), 4)
        out[f"{name}_range"] = [round(min(values), 4), round(max(values), 4)]
    return out


async def ceiling(
    client: Client, r: redis.Redis, workers: list[int], ms_file: Path, reps: int
) -> dict[str, Any]:
    """The data plane alone: the fixed-cost model told to cost nothing (it re-reads ``ms_file``
    within 0.5 s), arrays, items/s per worker process and every process's cost per item."""
    before = ms_file.read_text()
    ms_file.write_text("0")
    await asyncio.sleep(0.7)
    try:
        passes = [await bulk_pass(client, r, workers, _arrays) for _ in range(reps)]
    finally:
        ms_file.write_text(before)
    rates = [p["items_per_s"] / max(len(workers), 1) for p in passes]
    return {
        "dataplane_items_per_s_per_worker": round(statistics.median(rates), 1),
        "dataplane_items_per_s_per_worker_range": [round(min(rates), 1), round(max(rates), 1)],
        "dataplane_passes": passes,
    }


async def main(
    redis_url: str, triton: str, reps: int, ms_file: Path | None, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> dict[str, Any]:
    r = redis.Redis.from_url(redis_url)
    workers = workers_of(redis_url)
    extra: dict[str, Any] = {}
    async with Client(redis_url, chunk_size=chunk_size) as client:
        await load.bulk(client, FIXED, 512, timeout_s=TIMEOUT_S)  # warm: models, connections, scripts
        rest = at_rest(r)
        runs = []
        for rep in range(reps):
            runs.append(await repetition(client, r, workers, triton))
            print(json.dumps({"rep": rep, **runs[-1]}), flush=True)
        if ms_file is not None:
            extra = await ceiling(client, r, workers, ms_file, reps)
            print(json.dumps(extra), flush=True)
    return {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": f"python -m bench.columns --reps {reps}"
        + (" --ms-file PATH" if ms_file else "")
        + (f" --chunk-size {chunk_size}" if chunk_size != DEFAULT_CHUNK_SIZE else ""),
        "items": ITEMS,
        "chunk_size": chunk_size,
        "workers": len(workers),
        "redis_cpu_ms_per_s_at_rest": rest,
        **summary(runs),
        **{k: v for k, v in extra.items() if k != "dataplane_passes"},
        "details": {"runs": runs, "dataplane": extra.get("dataplane_passes", [])},
    }


def section(c: dict[str, Any]) -> list[str]:
    """The docs/benchmarks.md section of a columns run (bench/report.py adds it when columns.json exists)."""

    def cell(key: str) -> str:
        low, high = c[f"{key}_range"]
        return f"{c[key]} ({low}–{high})"

    rows = [
        f"| {label} | {cell(key)} |"
        for label, key in [
            ("bulk ÷ direct, envelopes (`iter_results`)", "p1_bulk_vs_direct"),
            ("bulk ÷ direct, arrays (`iter_arrays`)", "p1_bulk_vs_direct_arrays"),
            ("client CPU ms per item, envelopes", "cpu_ms_per_item_bulk_client"),
            ("client CPU ms per item, arrays", "cpu_ms_per_item_bulk_client_arrays"),
            ("worker CPU ms per item", "cpu_ms_per_item_bulk_worker"),
            ("Redis CPU µs per item", "redis_cpu_us_per_item_bulk"),
            ("Redis commands per item", "redis_commands_per_item_bulk"),
            ("data plane alone (model at 0 ms): items/s per worker", "dataplane_items_per_s_per_worker"),
        ]
        if key in c
    ]
    return [
        "## Bulk as arrays: envelopes vs `iter_arrays` on the stack `overspill up` starts",
        "",
        f"Command: `{c['command']}` against `OVERSPILL_GATEWAY_MODE=triton overspill up` (measured "
        f"{c['measured_at']}; {c['items']:,} fixed-cost texts a pass, {c['workers']} worker). Each "
        "repetition runs a direct batched Triton loop, the README's bulk code with envelopes and the "
        "same with arrays, one after the other; medians, with the range over repetitions:",
        "",
        "| figure | median (range) |",
        "|---|---|",
        *rows,
        "",
        "The client's CPU includes its `submit_many` (building and writing the chunks): arrays take out "
        "the envelopes' decoding, not the submission. The worker runs each chunk as a block "
        "(`workers/blocks/`: one routing decision, the texts batched as columns, one stored value per "
        "Triton request), so neither the worker nor Redis spends per item what it did when each item "
        "was an envelope (0.15 ms of worker CPU and 28–31 µs of Redis CPU before blocks). Redis "
        "commands are per package, counting those inside scripts (the fair claim, arq's job keys, the "
        "block scripts, the reader's passes): about a hundred for a chunk of 256.",
        "",
        *(
            [
                f"Where Redis's CPU per item goes: `INFO commandstats` puts "
                f"{c['redis_command_us_per_item_bulk']} µs an item inside commands (scripts' included), of "
                f"the {c['redis_cpu_us_per_item_bulk']} µs of Redis CPU above; the stack at rest costs Redis "
                f"{c['redis_cpu_ms_per_s_at_rest']} ms a second (workers' claims and beats, the API). A profile "
                "of redis-server during the passes (`perf record -F 2000 -g -p $(pgrep -f "
                "'redis-server.*6380') -- sleep 8`, 2026-12-08) had 45 % of its samples in the kernel "
                "(loopback TCP: a write's whole receive path runs in the writer's syscall), about 7 % of them "
                "the append-only file's writes (every block's bytes are appended), 38 % in redis-server "
                "itself and 7 % in jemalloc. Commands are not what sets it: chunks of 1,024 "
                "(`--chunk-size 1024`, `bench/results/columns-chunk1024.json`) take fewer commands an item "
                "and no less Redis CPU. What is left is round trips and bytes (1.5 KB of float32 an item, "
                "written, appended and read once): a goal of ≤ 5 µs an item is below what loopback TCP "
                "and the append-only file cost this machine for them.",
                "",
            ]
            if "redis_command_us_per_item_bulk" in c
            else []
        ),
        "",
        *(
            [
                "With the model told to cost nothing (`--ms-file`), the client, the worker, Redis and Triton "
                "share this machine's two cores: the items/s above is what their CPU per item, summed, lets "
                "two cores do (each process's share is in `bench/results/columns.json`), not one worker's "
                "ceiling on a machine where each has a core of its own.",
                "",
            ]
            if "dataplane_items_per_s_per_worker" in c
            else []
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.columns", description=__doc__)
    parser.add_argument("--redis", default="redis://127.0.0.1:6380/0")
    parser.add_argument("--triton", default="127.0.0.1:8001", help="Triton's gRPC address")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--ms-file",
        type=Path,
        help="the fixed-cost model's FIXED_COST_MS_FILE (start overspill up with it set): "
        "also measure the data plane alone, with the model at 0 ms",
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=DEFAULT_CHUNK_SIZE,
        help="the client's jobs per bulk chunk; a run at another size is kept as columns-chunkN.json",
    )
    a = parser.parse_args()
    result = asyncio.run(main(a.redis, a.triton, a.reps, a.ms_file, a.chunk_size))
    if a.chunk_size == DEFAULT_CHUNK_SIZE:
        also = ("p1_bulk_vs_direct", "cpu_ms_per_item_bulk", "redis_", "dataplane_")
        save_standalone("columns", result, also=also)
    else:
        save_standalone(f"columns-chunk{a.chunk_size}", result)
    print(json.dumps({k: v for k, v in result.items() if k != "details"}))
