"""Run a list of scenarios against one set of servers and write the results JSON."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import machine
from .context import Context
from .harness import Harness
from .latency import p3
from .memory import p5
from .overflow import p4
from .packing import p6
from .sizes import Sizes
from .sweep import sweep
from .throughput import p1, p2

log = logging.getLogger("bench")

Scenario = Callable[[Context], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {"p1": p1, "p2": p2, "p3": p3, "p6": p6, "p5": p5, "sweep": sweep, "p4": p4}
ALL = tuple(SCENARIOS)  # P2 before P3 and P6: they load at fractions of its capacity
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REQUIRED_KEYS = (
    "p1_bulk_vs_direct",
    "p2_vs_naive",
    "p2_vs_direct",
    "p3_p99_ratio",
    "p4_p99_wait_s_on",
    "p4_p99_wait_s_off",
    "p4_remote_share",
    "p5_redis_bytes_per_job",
    "p6_items_vs_arq_noop",
    "p6_p99_ms_at_half_load",
)


async def run_scenarios(names: tuple[str, ...], sizes: Sizes) -> dict[str, Any]:
    started = time.time()
    info = machine.describe()
    with Harness.start() as harness:
        ctx = Context(harness, sizes)
        timings: dict[str, float] = {}
        for name in names:
            t0 = time.perf_counter()
            log.info("running %s", name)
            await SCENARIOS[name](ctx)
            timings[name] = round(time.perf_counter() - t0, 1)
            log.info("%s done in %.1fs", name, timings[name])
    return {
        **ctx.headline,
        "machine": info,
        "commit": machine.commit(),
        "worktree_dirty": machine.dirty(),
        "started_at": dt.datetime.fromtimestamp(started, tz=dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 1),
        "scenario_s": timings,
        "scenarios": list(names),
        "sizes": asdict(sizes),
        "details": ctx.details,
    }


def write(result: dict[str, Any], out_dir: Path, *, latest: bool) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    suffix = "" if latest else "-" + "-".join(result["scenarios"])
    path = out_dir / f"{stamp}{suffix}.json"
    text = json.dumps(result, indent=2, sort_keys=False) + "\n"
    path.write_text(text)
    if latest:
        (out_dir / "latest.json").write_text(text)
    return path


def save_standalone(name: str, result: dict[str, Any], also: tuple[str, ...] = ()) -> dict[str, Any]:
    """A stand-alone scenario's result (``chaos``, ``scale``, ``tokens``) as ``results/NAME.json``;
    its headline keys (``NAME_*``, and those starting with a prefix in ``also``) travel into
    latest.json with the last full run's figures."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    latest = RESULTS_DIR / "latest.json"
    if latest.exists():
        merged = json.loads(latest.read_text())
        merged.update({k: v for k, v in result.items() if k.startswith((f"{name}_", *also))})
        latest.write_text(json.dumps(merged, indent=2) + "\n")
    return result


def run(names: tuple[str, ...], sizes: Sizes, out_dir: Path, *, latest: bool) -> tuple[dict[str, Any], Path]:
    result = asyncio.run(run_scenarios(names, sizes))
    return result, write(result, out_dir, latest=latest)
