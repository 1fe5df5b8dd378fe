"""The embedded stack: a private Redis, the bundled Triton, workers (and the API), as processes.

Parts given by URL (``OVERSPILL_REDIS_URL``, ``OVERSPILL_TRITON_URL``) are used as they are
instead of being started.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import redact_url

from .processes import MODEL_REPOSITORY, ManagedProcess, python_process, redis_process, triton_process
from .repository import repository_for
from .supervisor import RestartPolicy, Supervisor


class StackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="ignore")

    run_dir: Path = Path(".run")
    prefix: str = "overspill"
    redis_url: str | None = None  # unset: start a private redis-server
    redis_port: int = 6380
    redis_appendonly: bool = True
    triton_url: str | None = None  # gRPC host:port; unset: start the bundled tritonserver
    triton_metrics_url: str | None = None
    triton_http_port: int = 8000
    triton_grpc_port: int = 8001
    triton_metrics_port: int = 8002
    model_repository: Path = MODEL_REPOSITORY
    triton_device: Literal["cpu", "gpu"] = "cpu"  # gpu: the repository's GPU variant (stack/repository.py)
    triton_models: list[str] | None = None  # None: every model in the repository
    workers: int = 1
    # Worker i serves its metrics on this + i. The worker's own name for it, OVERSPILL_METRICS_PORT,
    # is the one to set (OVERSPILL_WORKER_METRICS_PORT is still read); 0 turns them off.
    worker_metrics_port: int = Field(
        default=9101, validation_alias=AliasChoices("OVERSPILL_METRICS_PORT", "OVERSPILL_WORKER_METRICS_PORT")
    )
    api_port: int = 8080  # 0: no API server
    # The remote OpenAI-compatible API. Unset: start our fake one (stack/fake_remote.py) on
    # fake_remote_port, so overflow and failover work out of the box; 0 there turns it off.
    remote_base_url: str | None = None
    fake_remote_port: int = 8900
    # Supervision (`overspill up`): a crashed part is restarted after a backoff doubling from
    # restart_backoff_s to restart_backoff_max_s (back to the start after restart_stable_s up);
    # more than restart_max restarts within restart_window_s make `overspill up` exit 1.
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 30.0
    restart_stable_s: float = 60.0
    restart_max: int = 5
    restart_window_s: float = 300.0

    def restart_policy(self) -> RestartPolicy:
        return RestartPolicy(
            backoff_s=self.restart_backoff_s,
            backoff_max_s=self.restart_backoff_max_s,
            stable_s=self.restart_stable_s,
            max_restarts=self.restart_max,
            window_s=self.restart_window_s,
        )


class Stack:
    """``with Stack(settings) as stack:`` starts every part and stops them in reverse order."""

    def __init__(
        self, settings: StackSettings | None = None, *, worker_env: dict[str, str] | None = None
    ) -> None:
        self.settings = settings or StackSettings()
        self.run_dir = self.settings.run_dir.resolve()
        self.worker_env = worker_env or {}
        self.redis: ManagedProcess | None = None
        self.triton: ManagedProcess | None = None
        self.workers: list[ManagedProcess] = []
        self.api: ManagedProcess | None = None
        self.fake_remote: ManagedProcess | None = None
        s = self.settings
        self.redis_url = s.redis_url or f"redis://127.0.0.1:{s.redis_port}/0"
        self.triton_url = s.triton_url or f"127.0.0.1:{s.triton_grpc_port}"
        self.triton_metrics_url = s.triton_metrics_url or f"http://127.0.0.1:{s.triton_metrics_port}/metrics"

    def env(self) -> dict[str, str]:
        """Environment for child processes: where everything is."""
        env = {
            "OVERSPILL_REDIS_URL": self.redis_url,
            "OVERSPILL_PREFIX": self.settings.prefix,
            "OVERSPILL_TRITON_URL": self.triton_url,
            "OVERSPILL_TRITON_METRICS_URL": self.triton_metrics_url,
        }
        if self.remote_base_url:
            env["OVERSPILL_REMOTE_BASE_URL"] = self.remote_base_url
        return env

    @property
    def remote_base_url(self) -> str | None:
        s = self.settings
        if s.remote_base_url:
            return s.remote_base_url
        return f"http://127.0.0.1:{s.fake_remote_port}/v1" if s.fake_remote_port else None

    def start_fake_remote(self) -> ManagedProcess:
        port = self.settings.fake_remote_port
        self.fake_remote = python_process(
            "fake-remote", "stack.fake_remote", self.run_dir, {}, args=["--port", str(port)],
            ready_url=f"http://127.0.0.1:{port}/_health",
        )  # fmt: skip
        return self.fake_remote.start()

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        # Each part is recorded before it is started: one that is interrupted (Ctrl-C) or never
        # gets ready is still stopped by stop().
        s = self.settings
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if s.redis_url is None:
            self.redis = redis_process(s.redis_port, self.run_dir, appendonly=s.redis_appendonly)
            self.redis.start()
        if s.triton_url is None:
            self.triton = triton_process(
                self.run_dir,
                http_port=s.triton_http_port,
                grpc_port=s.triton_grpc_port,
                metrics_port=s.triton_metrics_port,
                model_repository=repository_for(
                    s.triton_device, s.model_repository, self.run_dir / "model_repository-gpu"
                ),
                models=s.triton_models,
            )
            self.triton.start(timeout_s=180)
        if not s.remote_base_url and s.fake_remote_port:
            self.start_fake_remote()
        for i in range(s.workers):
            self.start_worker(i)
        if s.api_port:
            self.start_api()

    def start_worker(self, index: int | None = None) -> ManagedProcess:
        index = len(self.workers) if index is None else index
        env = {**self.env(), **self.worker_env}
        if self.settings.worker_metrics_port:
            env["OVERSPILL_METRICS_PORT"] = str(self.settings.worker_metrics_port + index)
        else:
            env["OVERSPILL_METRICS_PORT"] = "0"
        worker = python_process("worker", "workers", self.run_dir, env, log_name=f"worker-{index}")
        self.workers.append(worker)
        return worker.start()

    def start_api(self) -> ManagedProcess:
        """The HTTP API (``producer.api``) on ``api_port``; tenants come from OVERSPILL_TENANTS_FILE."""
        port = self.settings.api_port
        env = {**self.env(), "OVERSPILL_PORT": str(port)}
        if not os.environ.get("OVERSPILL_TENANTS_FILE"):
            # This launcher runs the stack on a laptop: without a tenants file, keys are off
            # on purpose (a deployment's API refuses to start that way).
            env.setdefault("OVERSPILL_AUTH", os.environ.get("OVERSPILL_AUTH", "off"))
        ready = f"http://127.0.0.1:{port}/healthz"
        self.api = python_process("api", "producer.api", self.run_dir, env, ready_url=ready)
        return self.api.start()

    def parts(self) -> list[tuple[str, ManagedProcess]]:
        """Every process this stack started, by name, in start order."""
        named = [("redis", self.redis), ("triton", self.triton), ("fake-remote", self.fake_remote)]
        named += [(f"worker-{i}", w) for i, w in enumerate(self.workers)]
        named.append(("api", self.api))
        return [(name, part) for name, part in named if part is not None]

    def supervise(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Restart any part that exits until ``stop()`` is true; raises CrashLoop on a crash loop."""
        supervisor = Supervisor(self.settings.restart_policy())
        for name, part in self.parts():
            supervisor.watch(name, part)
        supervisor.run(stop)

    def stop(self) -> None:
        for _, part in reversed(self.parts()):
            part.stop()

    def describe(self) -> str:
        """One line for a person: where each part is, never a password (URLs redacted)."""
        parts = [
            f"redis {redact_url(self.redis_url)}",
            f"triton grpc {self.triton_url}",
            f"{len(self.workers)} worker(s)",
        ]
        if self.api is not None:
            parts.append(f"api http://127.0.0.1:{self.settings.api_port}")
        if self.remote_base_url:
            kind = "fake " if self.fake_remote is not None else ""
            parts.append(f"{kind}remote {redact_url(self.remote_base_url)}")
        return ", ".join(parts) + f"; logs in {self.run_dir}"
