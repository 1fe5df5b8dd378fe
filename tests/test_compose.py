"""compose.yaml describes the production stack (there is no Docker engine here to run it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from producer import Client
from stack.processes import ManagedProcess, free_port, python_process, redis_server_binary
from tests.conftest import Triton, worker_env

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_every_part_is_a_service_with_a_health_check() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"redis", "triton", "worker", "api"}
    assert all("healthcheck" in s for s in services.values())


def test_redis_persists_with_aof_on_a_volume() -> None:
    redis = COMPOSE["services"]["redis"]
    assert "--appendonly yes" in redis["command"][0]
    assert redis["volumes"][0].split(":")[0] in COMPOSE["volumes"]


def test_triton_gets_a_gpu_the_models_and_their_packages() -> None:
    triton = COMPOSE["services"]["triton"]
    devices = triton["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert triton["build"]["args"]["TRITON_DEVICE"] == "${TRITON_DEVICE:-gpu}"
    dockerfile = (ROOT / triton["build"]["dockerfile"]).read_text()
    assert dockerfile.startswith("# ") and "ARG TRITON_BASE_IMAGE=nvcr.io/nvidia/tritonserver" in dockerfile
    assert "requirements.txt" in dockerfile
    # the image builds the repository for its device with the script the stack uses
    assert "COPY model_repository " in dockerfile and "COPY stack/repository.py " in dockerfile
    assert 'repository.py --device "$TRITON_DEVICE"' in dockerfile


def test_base_images_are_build_arguments_whose_defaults_are_the_public_images() -> None:
    """A GPU host's `docker compose up` is unchanged; `make compose-test` sets local ones."""
    services = COMPOSE["services"]
    assert services["redis"]["image"] == "${REDIS_IMAGE:-redis:7-alpine}"
    assert services["triton"]["build"]["args"]["TRITON_BASE_IMAGE"] == (
        "${TRITON_BASE_IMAGE:-nvcr.io/nvidia/tritonserver:24.10-py3}"
    )
    for name in ("worker", "api"):
        assert services[name]["build"]["args"]["BASE_IMAGE"] == "${OVERSPILL_BASE_IMAGE:-python:3.11-slim}"
    for dockerfile, arg in (
        ("deploy/Dockerfile", "BASE_IMAGE"),
        ("deploy/triton/Dockerfile", "TRITON_BASE_IMAGE"),
    ):
        text = (ROOT / dockerfile).read_text()
        assert f"ARG {arg}=" in text and f"FROM ${{{arg}}}" in text


def test_workers_and_api_point_at_redis_and_triton_and_wait_for_them() -> None:
    for name in ("worker", "api"):
        service = COMPOSE["services"][name]
        assert service["environment"]["OVERSPILL_REDIS_URL"] == "redis://redis:6379/0"  # no password in it
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert COMPOSE["services"]["worker"]["depends_on"]["triton"]["condition"] == "service_healthy"
    for path in (
        "deploy/Dockerfile",
        "deploy/triton/requirements.txt",
        "deploy/triton/requirements-nodeps.txt",
    ):
        assert (ROOT / path).exists()


def test_it_fails_closed_redis_password_tenants_file_bounded_memory() -> None:
    redis = COMPOSE["services"]["redis"]
    (command,) = redis["command"]
    assert '--requirepass "$$(cat /run/secrets/redis_password)"' in command
    assert "--maxmemory-policy noeviction" in command  # refuse writes, never drop jobs
    assert redis["secrets"] == ["redis_password"]
    assert COMPOSE["secrets"]["tenants"]["file"].startswith("${OVERSPILL_TENANTS_PATH:?")
    assert COMPOSE["secrets"]["redis_password"]["file"].startswith("${REDIS_PASSWORD_FILE:?")
    for name in ("worker", "api"):
        service = COMPOSE["services"][name]
        assert service["secrets"] == ["tenants", "redis_password"]
        assert service["environment"]["OVERSPILL_TENANTS_FILE"] == "/run/secrets/tenants"
        assert service["environment"]["OVERSPILL_REDIS_PASSWORD_FILE"] == "/run/secrets/redis_password"


def test_the_api_listens_where_compose_publishes_it(tmp_path: Path) -> None:
    """The command's --host/--port are the ones the server binds (a real process)."""
    api = COMPOSE["services"]["api"]
    command = api["command"]
    port = command[command.index("--port") + 1]
    assert api["ports"] == [f"{port}:{port}"] and command[command.index("--host") + 1] == "0.0.0.0"
    free = free_port()
    tenants = tmp_path / "tenants.json"
    tenants.write_text('{"tenants": []}')
    env = {**os.environ, "OVERSPILL_TENANTS_FILE": str(tenants), "OVERSPILL_PORT": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "producer.api", "--host", "127.0.0.1", "--port", str(free)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{free}/healthz", timeout=1).status_code == 200
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the API did not bind --port"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(10)


def test_without_a_tenants_file_the_api_refuses_to_start() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OVERSPILL_TENANTS_FILE", "OVERSPILL_AUTH")}
    done = subprocess.run(
        [sys.executable, "-m", "producer.api", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "OVERSPILL_TENANTS_FILE" in done.stderr and "OVERSPILL_AUTH=off" in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_redis_password_from_a_secret_file_reaches_client_and_worker(
    tmp_path: Path, run_dir: Path, triton: Triton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OVERSPILL_REDIS_PASSWORD_FILE (a mounted secret) instead of a password in the URL."""
    secret = tmp_path / "redis_password"
    secret.write_text("p@ss/w:rd\n")
    port = free_port()
    cmd = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--dir", str(tmp_path), "--requirepass", "p@ss/w:rd"]  # fmt: skip
    server = ManagedProcess(
        "redis", cmd, run_dir / f"redis-secret-{port}.log", ready=lambda: _listening(port)
    )
    server.start()
    url = f"redis://127.0.0.1:{port}/0"  # no password in it
    monkeypatch.setenv("OVERSPILL_REDIS_PASSWORD_FILE", str(secret))
    env = {**worker_env(url, triton, "secret"), "OVERSPILL_REDIS_PASSWORD_FILE": str(secret)}
    worker = python_process("worker", "workers", run_dir, env, log_name="worker-secret").start()
    try:
        async with Client(url, prefix="secret") as client:
            job_id = await client.submit("embed", {"model": "fixed-cost", "input": "behind a password"})
            assert (await client.wait(job_id, timeout=60)).status == "succeeded"
    finally:
        worker.stop()
        server.stop()


def _listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
