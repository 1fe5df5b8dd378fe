"""PNG plots for docs/benchmarks.md: throughput vs batch window, latency vs load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def batch_window(points: list[dict[str, Any]], path: Path) -> None:
    """Items/s and p99 against max_wait_ms, one line per max_batch."""
    fig, (ax_rate, ax_p99) = plt.subplots(1, 2, figsize=(10, 4))
    for batch in sorted({p["max_batch"] for p in points}):
        row = sorted((p for p in points if p["max_batch"] == batch), key=lambda p: p["max_wait_ms"])
        waits = [p["max_wait_ms"] for p in row]
        ax_rate.plot(waits, [p["items_per_s"] for p in row], marker="o", label=f"max_batch {batch}")
        ax_p99.plot(waits, [p.get("p99_ms", 0) for p in row], marker="o", label=f"max_batch {batch}")
    waits = sorted({p["max_wait_ms"] for p in points})
    for ax, label in ((ax_rate, "items/s (closed loop, saturation)"), (ax_p99, "p99 submit→result (ms)")):
        ax.set_xscale("log")
        ax.set_xticks(waits, [f"{w:g}" for w in waits])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("worker max_wait_ms (fixed-cost model, 5 ms per execution)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("Batch window sweep: `python -m bench sweep`")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_vs_load(p3: dict[str, Any], path: Path) -> None:
    """p50/p95/p99 against offered load, overspill (solid) and direct single calls (dashed)."""
    models = list(p3)
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        levels = p3[model]["levels"]
        x = [row["offered_per_s"] for row in levels]
        for q, color in (("p50", "tab:blue"), ("p95", "tab:orange"), ("p99", "tab:red")):
            ax.plot(x, [row["overspill"].get(f"{q}_ms", 0) for row in levels], color=color, marker="o",
                    label=f"overspill {q}")  # fmt: skip
            ax.plot(x, [row["direct"].get(f"{q}_ms", 0) for row in levels], color=color, marker="x",
                    linestyle="--", label=f"direct {q}")  # fmt: skip
        ax.set_yscale("log")
        ax.set_xlabel("offered load (requests/s, open loop)")
        ax.set_ylabel("submit→result (ms)")
        ax.set_title(f"{model} (capacity {p3[model]['capacity_per_s']:.0f}/s)")
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle("Latency vs load: `python -m bench p3`")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
