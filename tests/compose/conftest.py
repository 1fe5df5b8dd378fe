"""Fixtures for `make compose-test`: compose.yaml built and started for real, once per session.

- ``engine``: a private dockerd (``tests/compose/engine.py``), torn down with its data root.
- ``stack``: the images built from compose.yaml (``override.yaml`` changes only what this
  machine forces) and ``docker compose up --wait``; secrets in files, a tenant with a key.
- ``report``: figures the specifications record, written to bench/results/compose.json.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stack.processes import free_port
from tests.compose.engine import ROOT, Compose, Engine, import_base_image

HERE = Path(__file__).resolve().parent
RESULTS = ROOT / "bench" / "results" / "compose.json"


@dataclass
class Stack:
    compose: Compose
    api: str  # http://127.0.0.1:<published port>
    api_key: str
    secrets: tuple[str, ...]  # every secret value, to look for where none may appear


@pytest.fixture(scope="session")
def report() -> Iterator[dict[str, Any]]:
    figures: dict[str, Any] = {}
    yield figures
    if figures:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        figures["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        RESULTS.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    started = Engine().start()
    yield started
    started.clean()


def write_secrets(directory: Path) -> tuple[dict[str, str], str, str]:
    """A Redis password file and a tenants file with one tenant's key digest (never the key)."""
    password = secrets.token_urlsafe(24)
    api_key = "osk_" + secrets.token_urlsafe(32)
    (directory / "redis_password").write_text(password)
    tenant = {
        "name": "acme",
        "api_key_sha256": [hashlib.sha256(api_key.encode()).hexdigest()],
        "rate_per_s": 1000, "burst": 1000,  # the load's 100 jobs/s, above the default limit
    }  # fmt: skip
    (directory / "tenants.json").write_text(json.dumps({"tenants": [tenant]}))
    files = {
        "REDIS_PASSWORD_FILE": str(directory / "redis_password"),
        "OVERSPILL_TENANTS_PATH": str(directory / "tenants.json"),
    }
    return files, password, api_key


def machine_variables(base_image: str, api_port: int) -> dict[str, str]:
    """compose.yaml's own variables, set to what this machine has: local images, no GPU."""
    return {
        "OVERSPILL_BASE_IMAGE": base_image,
        "REDIS_IMAGE": base_image,
        "TRITON_DEVICE": "cpu",
        "OVERSPILL_COMPOSE_API_PORT": str(api_port),
    }


@pytest.fixture(scope="session")
def stack(
    engine: Engine, report: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    base_image = import_base_image(engine)
    files, password, api_key = write_secrets(tmp_path_factory.mktemp("secrets"))
    port = free_port()
    compose = Compose(
        engine, "overspill", [ROOT / "compose.yaml", HERE / "override.yaml"],
        {**files, **machine_variables(base_image, port)},
    )  # fmt: skip
    started = time.monotonic()
    compose("build", timeout=1500)
    report["compose_build_s"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    compose.up()
    report["compose_up_s"] = round(time.monotonic() - started, 1)
    try:
        yield Stack(compose, f"http://127.0.0.1:{port}", api_key, (password, api_key))
    finally:
        compose("down", "--volumes", "--remove-orphans", "--timeout", "10", timeout=180, check=False)
