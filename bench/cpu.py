"""CPU time per process over a phase (from /proc/<pid>/stat), to show where the cores go.

On a 2-core machine the load generator, Redis, the worker and Triton share the CPU, so
the per-item CPU of each explains a throughput figure better than the figure alone.
"""

from __future__ import annotations

import os
from pathlib import Path

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` itself so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = (int(f) for f in fields[11:13])
    return (utime + stime) * TICK_S


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` plus its live children (Triton runs each model in a stub process)."""
    total = cpu_s(pid)
    for child in children(pid):
        total += cpu_s(child)
    return total


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(c) for c in path.read_text().split()]
    except OSError:
        return []


class CpuMeter:
    """``with CpuMeter(pids) as m: ...``; then ``m.ms_per_item(n)`` per process name.

    Processes named in ``with_children`` are charged with their children too (Triton's model
    stubs); the others only with themselves (the load generator is every server's parent).
    """

    def __init__(self, pids: dict[str, int], with_children: frozenset[str] = frozenset({"triton"})) -> None:
        self.pids = pids
        self.with_children = with_children
        self.start: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            try:
                out[name] = tree_cpu_s(pid) if name in self.with_children else cpu_s(pid)
            except OSError:
                out[name] = 0.0
        return out

    def __enter__(self) -> CpuMeter:
        self.start = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._read()
        self.used = {name: end[name] - self.start.get(name, 0.0) for name in end}

    def ms_per_item(self, items: int) -> dict[str, float]:
        if items <= 0:
            return {}
        return {name: round(s * 1000 / items, 3) for name, s in self.used.items()}
