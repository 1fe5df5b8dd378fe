"""Small statistics: percentiles, medians, and a throughput/latency record."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100), nearest-rank on sorted values; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return float(ordered[rank])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


@dataclass
class Run:
    """One measured phase: items done in ``seconds``, with per-item latencies (ms)."""

    items: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    failed: int = 0
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "latencies_ms"}
        out["seconds"] = round(self.seconds, 3)
        out["items_per_s"] = round(self.rate, 1)
        if self.latencies_ms:
            for q in (50, 95, 99):
                out[f"p{q}_ms"] = round(percentile(self.latencies_ms, q), 2)
        return out


def median_run(runs: Sequence[Run]) -> Run:
    """The repetition with the median rate (keeps its latencies together)."""
    ordered = sorted(runs, key=lambda r: r.rate)
    return ordered[len(ordered) // 2]


def ratio_range(ours: dict[str, Any], theirs: dict[str, Any]) -> list[float]:
    """The run-to-run range of ``ours ÷ theirs``: each of our repetitions' rates over the
    median rate of theirs (both :func:`reps_summary` dicts)."""
    rates = ours.get("rates") or [ours["items_per_s"]]
    return [ratio(min(rates), theirs["items_per_s"]), ratio(max(rates), theirs["items_per_s"])]


def reps_summary(runs: Sequence[Run]) -> dict[str, Any]:
    best = median_run(runs)
    out = best.summary()
    out["rates"] = [round(r.rate, 1) for r in runs]
    return out
