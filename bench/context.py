"""What a benchmark run carries between scenarios: servers, sizes, and the figures so far."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from producer import Client

from .cpu import CpuMeter
from .harness import Harness
from .sizes import Sizes

MAIN_PREFIX = "bench"  # the default worker's prefix, shared by P1, P2, P3 and P6


@dataclass
class Context:
    harness: Harness
    sizes: Sizes
    details: dict[str, Any] = field(default_factory=dict)
    headline: dict[str, float | None] = field(default_factory=dict)

    def main_worker(self) -> None:
        """Make sure exactly the default worker runs (other scenarios start their own)."""
        running = [w for w in self.harness.workers if w.alive()]
        if len(running) == 1 and MAIN_PREFIX in running[0].log_path.name:
            return
        self.harness.stop_workers()
        self.harness.start_worker(MAIN_PREFIX)

    def pids(self) -> dict[str, int]:
        """The processes whose CPU a phase is charged with: this one, Redis, Triton, workers."""
        h = self.harness
        out = {"load_generator": os.getpid(), "redis": h.redis_proc.pid, "triton": h.triton.process.pid}
        for i, w in enumerate(w for w in h.workers if w.alive() and w.name == "worker"):
            out[f"worker{i}" if i else "worker"] = w.pid
        return out

    def cpu(self) -> CpuMeter:
        return CpuMeter(self.pids())

    @contextlib.contextmanager
    def packing(self) -> Iterator[dict[str, float]]:
        """Yields a dict that afterwards holds items per work package over the block."""
        out: dict[str, float] = {}
        items0, packages0 = self.harness.package_counts()
        yield out
        items1, packages1 = self.harness.package_counts()
        packages = packages1 - packages0
        out["items_per_package"] = round((items1 - items0) / packages, 2) if packages else 0.0
        out["packages"] = packages

    def client(self, prefix: str = MAIN_PREFIX, **kwargs: Any) -> Client:
        return Client(self.harness.redis_url, prefix=prefix, result_ttl_s=600, **kwargs)


def supports_uncoalesced() -> bool:
    """Whether this client can send one arq job per ``submit`` (``coalesce_window_ms=None``)."""
    return "coalesce_window_ms" in inspect.signature(Client.__init__).parameters
