"""Markdown building blocks of docs/benchmarks.md: goals, number formats, tables, commands."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .packing import P99_GOAL_MS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PY = ".venv/bin/python -m bench"
ALL_CMD = f"{PY} all"

# key → (what it is, goal, met?).
Goal = tuple[str, str, Callable[[float], bool] | None]
HEADLINE: dict[str, Goal] = {
    "p1_bulk_vs_direct": (
        "P1 bulk items/s, overspill ÷ direct batched (fixed-cost 5 ms)",
        "≥ 0.85",
        lambda v: v >= 0.85,
    ),
    "p1_bulk_vs_direct_range": ("P1 run-to-run range: each repetition ÷ direct's median", "", None),
    "p1_bulk_vs_direct_embedding": ("P1 the same on the real embedding model", "≈ 1", None),
    "p2_vs_naive": (
        "P2 interactive jobs/s ÷ naive one-call-per-request (fixed-cost)",
        "≥ 5",
        lambda v: v >= 5,
    ),
    "p2_vs_direct": ("P2 interactive jobs/s ÷ direct batched (fixed-cost)", "≥ 0.6", lambda v: v >= 0.6),
    "p2_vs_direct_range": ("P2 run-to-run range: each repetition ÷ direct's median", "", None),
    "p2_vs_naive_embedding": ("P2 ÷ naive, real embedding model", "", None),
    "cpu_ms_per_item_direct": ("CPU ms per item, direct batched client + Triton (fixed-cost)", "", None),
    "cpu_ms_per_item_bulk": ("CPU ms per item, P1 bulk, all our processes (fixed-cost)", "", None),
    "cpu_bulk_vs_direct": ("P1 bulk CPU per item ÷ direct's", "≤ 2.5", lambda v: v <= 2.5),
    "cpu_ms_per_item_interactive": ("CPU ms per item, P2 interactive, all our processes", "", None),
    "cpu_interactive_vs_direct": ("P2 interactive CPU per item ÷ direct's", "≤ 5", lambda v: v <= 5),
    "p2_vs_direct_embedding": ("P2 ÷ direct batched, real embedding model", "", None),
    "p3_p99_ratio": ("P3 p99 overspill ÷ direct single calls at 50 % load (fixed-cost)", "", None),
    "p3_p99_ratio_embedding": ("P3 the same on the real embedding model", "", None),
    "p4_p99_wait_s_on": (
        "P4 interactive p99 submit→result (s) at 3× local capacity, overflow on",
        "< off",
        None,
    ),
    "p4_p99_wait_s_off": ("P4 the same with overflow off", "", None),
    "p4_remote_share": ("P4 share of jobs the remote served, overflow on", "", None),
    "p4_p99_off_vs_on": ("P4 p99 off ÷ on", "> 1", lambda v: v > 1),
    "p5_redis_bytes_per_job": ("P5 Redis bytes per queued single-text embedding job", "", None),
    "p5_worker_rss_growth_mib": ("P5 worker RSS growth over the processed jobs (MiB)", "", None),
    "p6_items_vs_arq_noop": (
        "P6 interactive items/s ÷ arq no-op jobs/s (fixed-cost)",
        "≥ 2",
        lambda v: v >= 2,
    ),
    "p6_api_items_vs_arq_noop": (
        "P6 the same through the HTTP API (single-item POST /v1/embeddings)",
        "≥ 2",
        lambda v: v >= 2,
    ),
    "p6_items_vs_one_job_per_request": ("P6 coalesced ÷ one arq job per request", "", None),
    "p6_p99_ms_at_half_load": (
        "P6 p99 (ms) at 50 % of capacity (fixed-cost)",
        f"≤ {P99_GOAL_MS:g}",
        lambda v: v <= P99_GOAL_MS,
    ),
    "sweep_best_items_per_s": ("Sweep: best interactive items/s over the batch windows", "", None),
    "workers_2_vs_1_interactive": ("2 ÷ 1 worker processes, interactive items/s", "", None),
    "workers_2_vs_1_bulk": ("2 ÷ 1 worker processes, bulk items/s", "", None),
}
SECTION = {
    "p1": "p1",
    "p2": "p2",
    "p3": "p3",
    "p4": "p4",
    "p5": "p5",
    "p6": "p6",
    "sw": "sweep",
    "wo": "sweep",
    "cp": "p1",
    "cpu_ms_per_item_interactive": "p2",
    "cpu_interactive_vs_direct": "p2",
}


def fmt(value: Any) -> str:
    """Numbers to about three significant figures; None is a figure that was not measured."""
    if value is None:
        return "not run"
    if isinstance(value, list):
        return "–".join(fmt(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return out + [""]


def command(key: str) -> str:
    return f"`{PY} {SECTION.get(key, SECTION.get(key[:2], 'all'))}`"


def headline(r: dict[str, Any]) -> list[str]:
    rows = []
    for key, (what, goal, check) in HEADLINE.items():
        if key not in r:
            continue
        value = r[key]
        met = "" if check is None or value is None else ("met" if check(value) else "**not met**")
        rows.append([f"`{key}`", what, fmt(value), goal, met, command(key)])
    return table(["key", "figure", "value", "goal", "", "command (one section)"], rows)


def machine(r: dict[str, Any]) -> list[str]:
    m = r["machine"]
    gpu = "yes" if m["gpu"] else "no (CPU only)"
    dirty = " (with uncommitted changes in the work tree)" if r.get("worktree_dirty") else ""
    return [
        f"- CPU: {m['cpu_model']}, {m['cores']} cores; GPU: {gpu}; memory {m.get('memory_gib', '?')} GiB",
        f"- Python {m['python']}, Linux {m.get('kernel', '?')}; load average at start {m.get('load_avg_at_start')}",
        f"- commit `{r['commit']}`{dirty}; started {r['started_at']}, {r['duration_s']:.0f} s in all",
        f"- scenario durations (s): {', '.join(f'{k} {v}' for k, v in r.get('scenario_s', {}).items())}",
        f"- repetitions per figure: {r['sizes']['reps']} (the median is shown, every rate is in the JSON)",
        "",
    ]


def cpu_cell(cpu: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in cpu.items()) if cpu else ""
