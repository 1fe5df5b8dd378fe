"""Secrets mounted as files, as Kubernetes mounts a Secret, re-read without a restart.

A Secret volume is a directory whose files are symlinks through ``..data``, itself a symlink to
a timestamped directory; an update writes a new directory and swaps ``..data`` in one rename.
Both the tenants file (read by a running API process) and the remote API key file (read by
the worker's remote backend) must follow that swap.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from pathlib import Path

import httpx

from producer.contract import hash_api_key
from tests.fixtures_api import api_url, start_api
from workers.backends.remote import ApiKey, RemoteConfig

JOB = {"kind": "embed", "body": {"model": "fixed-cost", "input": "secret files"}}


class SecretMount:
    """A directory laid out as the kubelet lays out a Secret volume."""

    def __init__(self, root: Path, name: str) -> None:
        self.root, self.name = root, name
        root.mkdir(parents=True)
        self.path = root / name

    def publish(self, content: str) -> None:
        """Write a new version and swap it in atomically (the kubelet's ``..data`` rename)."""
        version = self.root / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{secrets.token_hex(4)}"
        version.mkdir()
        (version / self.name).write_text(content)
        link = self.root / "..data_tmp"
        link.symlink_to(version.name)
        os.replace(link, self.root / "..data")
        if not self.path.is_symlink():
            self.path.symlink_to(f"..data/{self.name}")


def _tenants(*keys: tuple[str, str]) -> str:
    return json.dumps({"tenants": [{"name": name, "api_key_sha256": [hash_api_key(k)]} for name, k in keys]})


async def _status_within(http: httpx.AsyncClient, key: str, want: int, seconds: float = 5.0) -> int:
    """Submit with ``key`` until the answer is ``want`` or ``seconds`` pass; the last status."""
    deadline = time.monotonic() + seconds
    while True:
        status = (
            await http.post("/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {key}"})
        ).status_code
        if status == want or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.2)


async def test_a_running_api_follows_the_tenants_secret_and_keeps_the_last_good_one(
    run_dir: Path, redis_url: str, prefix: str
) -> None:
    old, new = "osk_" + secrets.token_urlsafe(24), "osk_" + secrets.token_urlsafe(24)
    mount = SecretMount(run_dir / f"tenants-secret-{prefix}", "tenants.json")
    mount.publish(_tenants(("acme", old)))
    api = start_api(run_dir, redis_url, prefix, mount.path)
    try:
        async with httpx.AsyncClient(base_url=api_url(api), timeout=10) as http:
            assert await _status_within(http, old, 202, 0) == 202
            assert await _status_within(http, new, 401, 0) == 401
            mount.publish(_tenants(("acme", new)))  # the key rotated: old removed, new added
            started = time.monotonic()
            assert await _status_within(http, new, 202) == 202, "the new key was not taken up"
            taken_up_s = time.monotonic() - started
            assert await _status_within(http, old, 401, 0) == 401, "the removed key still works"
            mount.publish("{not json")  # a broken update: the last good file stays in force
            await asyncio.sleep(1.5)  # past the reload check interval
            assert await _status_within(http, new, 202, 0) == 202
            assert await _status_within(http, old, 401, 0) == 401
        print(f"new tenants key taken up after {taken_up_s:.2f} s")
        assert "tenants file unreadable" in api.log_path.read_text()
    finally:
        api.stop()


def test_the_remote_key_follows_a_secret_mount_swap(tmp_path: Path) -> None:
    mount = SecretMount(tmp_path / "remote-secret", "api-key")
    mount.publish("sk-first\n")
    key = ApiKey(RemoteConfig(base_url="http://remote.invalid/v1", api_key_file=mount.path))
    assert key.get() == "sk-first"
    mount.publish("sk-second-rotated\n")
    assert key.get() == "sk-second-rotated"
