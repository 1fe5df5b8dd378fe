"""The servers a benchmark run measures: a private redis-server, tritonserver, workers.

All on free loopback ports in a temporary run directory, started as real processes with
:mod:`stack.processes` and stopped when the run ends. Nothing here touches Redis on 6379.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from stack import StackSettings, processes
from stack.processes import ManagedProcess, free_port, python_process, redis_process
from workers.core.settings import DEFAULT_MODELS, ModelSpec
from workers.routing import ModelCounters, model_counters

TRITON_MODELS = ["fixed_cost", "embedding"]
FIXED = "fixed-cost"  # overspill's name for the Triton model ``fixed_cost``
EMBED = "all-MiniLM-L6-v2"  # overspill's name for the Triton model ``embedding``
TRITON_NAME = {FIXED: "fixed_cost", EMBED: "embedding"}


class Triton(processes.TritonServer):
    def set_exec_ms(self, ms: float) -> None:
        """The fixed-cost model re-reads this within 0.5 s: wait until it has."""
        super().set_exec_ms(ms)
        time.sleep(0.7)

    def counters(self, model: str) -> ModelCounters:
        text = httpx.get(self.metrics_url, timeout=5.0).text
        return model_counters(text).get(model, ModelCounters())


def models_env(fixed: dict[str, Any] | None = None) -> str:
    """``OVERSPILL_MODELS`` JSON: the default catalogue with overrides for the fixed-cost model."""
    specs: list[ModelSpec] = []
    for spec in DEFAULT_MODELS:
        if spec.name == FIXED and fixed:
            spec = spec.model_copy(update=fixed)
        specs.append(spec)
    return json.dumps([s.model_dump(mode="json") for s in specs])


@dataclass
class Harness:
    """One run's servers. ``with Harness.start() as h:``; workers come and go per scenario."""

    run_dir: Path
    redis_port: int
    triton: Triton
    redis_proc: ManagedProcess
    workers: list[ManagedProcess] = field(default_factory=list)
    metrics_urls: dict[int, str] = field(default_factory=dict)  # worker pid → its /metrics

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @classmethod
    @contextlib.contextmanager
    def start(cls) -> Iterator[Harness]:
        with tempfile.TemporaryDirectory(prefix="overspill-bench-") as tmp:
            run_dir = Path(tmp)
            port = free_port()
            # Redis as `overspill up` runs it (AOF on, fsync every second): what users measure.
            redis_proc = redis_process(port, run_dir, appendonly=StackSettings().redis_appendonly).start()
            try:
                triton = start_triton(run_dir)
            except BaseException:
                redis_proc.stop()
                raise
            harness = cls(run_dir, port, triton, redis_proc)
            try:
                yield harness
            finally:
                harness.stop_workers()
                triton.process.stop()
                redis_proc.stop()

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)

    def used_memory(self) -> int:
        with self.redis() as r:
            return int(r.info("memory")["used_memory"])

    def flush(self) -> None:
        """Forget every key (results of the last scenario), so memory and queues start clean."""
        with self.redis() as r:
            r.flushdb()

    def worker_env(self, prefix: str, **overrides: str) -> dict[str, str]:
        env = {
            "OVERSPILL_REDIS_URL": self.redis_url,
            "OVERSPILL_PREFIX": prefix,
            "OVERSPILL_TRITON_URL": self.triton.grpc_url,
            "OVERSPILL_TRITON_METRICS_URL": self.triton.metrics_url,
            "OVERSPILL_RESULT_TTL_S": "600",
            "OVERSPILL_LOG_LEVEL": "WARNING",
        }
        env.update(overrides)
        return env

    def start_worker(self, prefix: str, **overrides: str) -> ManagedProcess:
        """A worker process on ``prefix``; returns once it logged that it runs."""
        port = free_port()
        env = self.worker_env(
            prefix, OVERSPILL_LOG_LEVEL="INFO", OVERSPILL_METRICS_PORT=str(port), **overrides
        )
        name = f"worker-{prefix}-{len(self.workers)}"
        proc = python_process("worker", "workers", self.run_dir, env, log_name=name).start()
        self.workers.append(proc)
        self.metrics_urls[proc.pid] = f"http://127.0.0.1:{port}/metrics"
        wait_for_log(proc, "worker started", timeout_s=60.0)
        return proc

    def start_process(
        self, name: str, module: str, env: dict[str, str], args: list[str], *, ready_url: str | None = None
    ) -> ManagedProcess:
        """Another Python process of this run (stopped with the workers)."""
        proc = python_process(name, module, self.run_dir, env, log_name=name, args=args, ready_url=ready_url)
        proc.start(timeout_s=60)
        self.workers.append(proc)
        return proc

    def stop_workers(self) -> None:
        for proc in reversed(self.workers):
            proc.stop()
        self.workers.clear()
        self.metrics_urls.clear()

    def stop_worker(self, proc: ManagedProcess) -> None:
        proc.stop()
        self.workers.remove(proc)
        self.metrics_urls.pop(proc.pid, None)

    def package_counts(self) -> tuple[float, float]:
        """(items finished, work packages run) summed over the live workers' /metrics."""
        items = packages = 0.0
        for pid, url in self.metrics_urls.items():
            if not any(w.pid == pid and w.alive() for w in self.workers):
                continue
            for family in text_string_to_metric_families(httpx.get(url, timeout=5.0).text):
                for sample in family.samples:
                    if sample.name == "overspill_jobs_total":
                        items += sample.value
                    elif sample.name == "overspill_packages_total" and sample.labels.get("outcome") == "done":
                        packages += sample.value
        return items, packages


def start_triton(run_dir: Path) -> Triton:
    server = processes.start_triton(run_dir, models=TRITON_MODELS)
    return Triton(server.grpc_url, server.http_url, server.metrics_url, server.process, server.exec_ms_file)


def wait_for_log(proc: ManagedProcess, text: str, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited; see {proc.log_path}")
        with contextlib.suppress(OSError):
            if text in proc.log_path.read_text(errors="replace"):
                return
        time.sleep(0.05)
    raise RuntimeError(f"{proc.name}: no {text!r} after {timeout_s:.0f}s; see {proc.log_path}")


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (VmRSS from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
