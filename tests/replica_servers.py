"""Real tritonservers serving ``fixed_cost`` for the replica tests: a replica, its ports and
its own request counter, spawned with a cost file of its own."""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from stack.processes import (
    ManagedProcess,
    triton_process,
)

MODEL = "fixed_cost"


@dataclass
class Replica:
    http: int
    grpc: int
    metrics: int
    process: ManagedProcess
    ms_file: Path
    address: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"{self.address}:{self.grpc}"

    def successes(self) -> float:
        """Requests this server answered (its own nv_inference_request_success)."""
        with urllib.request.urlopen(f"http://{self.address}:{self.metrics}/metrics", timeout=2) as r:
            text = r.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("nv_inference_request_success{") and f'model="{MODEL}"' in line
        )

    def settled_successes(self, quiet_s: float = 0.2, timeout_s: float = 5.0) -> float:
        """``successes()`` once it has stopped moving: Triton counts a request after its response
        is on the wire, so a read right after a load can miss the last few."""
        last = self.successes()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.successes()
            if now == last:
                return now
            last = now
        raise AssertionError(f"{self.url}'s request count still moving after {timeout_s} s")


def spawn_replica(run_dir: Path, ports: tuple[int, int, int]) -> Replica:
    http, grpc, metrics = ports
    ms_file = run_dir / f"replica_ms-{grpc}"
    ms_file.write_text("50")
    proc = triton_process(
        run_dir, http_port=http, grpc_port=grpc, metrics_port=metrics, models=[MODEL],
        extra_env={"FIXED_COST_MS_FILE": str(ms_file)},
    ).start(wait=False)  # fmt: skip
    return Replica(http, grpc, metrics, proc, ms_file)
