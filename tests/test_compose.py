"""compose.yaml describes the production stack (there is no Docker engine here to run it)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_every_part_is_a_service_with_a_health_check() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"redis", "triton", "worker", "api"}
    assert all("healthcheck" in s for s in services.values())


def test_redis_persists_with_aof_on_a_volume() -> None:
    redis = COMPOSE["services"]["redis"]
    assert "--appendonly" in redis["command"] and "yes" in redis["command"]
    assert redis["volumes"][0].split(":")[0] in COMPOSE["volumes"]


def test_triton_gets_a_gpu_the_models_and_their_packages() -> None:
    triton = COMPOSE["services"]["triton"]
    devices = triton["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert any(v.startswith("./model_repository:") for v in triton["volumes"])
    dockerfile = (ROOT / triton["build"]["dockerfile"]).read_text()
    assert dockerfile.startswith("# ") and "FROM nvcr.io/nvidia/tritonserver" in dockerfile
    assert "requirements.txt" in dockerfile


def test_workers_and_api_point_at_redis_and_triton_and_wait_for_them() -> None:
    for name in ("worker", "api"):
        service = COMPOSE["services"][name]
        assert service["environment"]["OVERSPILL_REDIS_URL"] == "redis://redis:6379/0"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert COMPOSE["services"]["worker"]["depends_on"]["triton"]["condition"] == "service_healthy"
    for path in (
        "deploy/Dockerfile",
        "deploy/triton/requirements.txt",
        "deploy/triton/requirements-nodeps.txt",
    ):
        assert (ROOT / path).exists()
