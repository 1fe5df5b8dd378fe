"""``overspill bulk``: a batch from a JSONL file, through the HTTP API or straight to Redis,
resumable, with a progress bar; its errors say what went wrong.

The command runs as a process against the session's batch stack (API, workers, Redis, Triton).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stack.processes import ROOT
from tests.fixtures_api import TenantKeys
from tests.fixtures_batches import BatchStack, embed_line, jsonl


def overspill(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [str(Path(sys.executable).parent / "overspill"), "bulk", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ})


def test_cli_through_the_api_resumes(bulk_stack: BatchStack, tenants: TenantKeys, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([embed_line(i, tag="cli") for i in range(300)]))
    out = tmp_path / "out.jsonl"
    common = [str(source), "-o", str(out), "--api-url", bulk_stack.url, "--api-key", tenants.keys["acme"]]
    first = overspill(*common, "--no-wait")
    assert first.returncode == 0, first.stderr
    batch_id = json.loads(first.stdout)["batch_id"]
    state = json.loads((tmp_path / "out.jsonl.state").read_text())
    assert state["batch_id"] == batch_id and not out.exists()
    second = overspill(*common, "--wait")
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    assert summary["batch_id"] == batch_id and summary["status"] == "completed"
    assert "req" in second.stderr and "local=" in second.stderr  # the progress bar, with routes
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"cli-{i}" for i in range(300))
    assert all(line["response"]["status_code"] == 200 for line in lines)
    third = overspill(*common)
    assert json.loads(third.stdout)["batch_id"] == batch_id


def test_cli_with_a_wrong_api_key_says_the_key_was_refused(bulk_stack: BatchStack, tmp_path: Path) -> None:
    """Not "cannot reach overspill … ReadError": the API answered, and refused the key."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([embed_line(i, tag="key") for i in range(2000)]))  # a large upload
    run = overspill(str(source), "-o", str(tmp_path / "out.jsonl"), "--api-url", bulk_stack.url,
                    "--api-key", "sk-not-a-key")  # fmt: skip
    assert run.returncode != 0
    error = json.loads([line for line in run.stderr.splitlines() if line.strip()][-1])["error"]
    assert error["type"] == "api_error", error
    assert "401" in error["message"] and "refused the key" in error["message"]
    assert "sk-not-a-key" not in run.stderr


def test_cli_straight_to_redis_resumes(
    bulk_stack: BatchStack, redis_url: str, run_dir: Path, tmp_path: Path
) -> None:
    """No API in the loop: the command drives its own batch; --no-wait then --wait picks it up."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        jsonl(
            [embed_line(i, tag="direct") for i in range(200)]
            + [{**embed_line(999, tag="direct"), "body": {"model": "fixed-cost", "input": []}}]
        )
    )
    out = tmp_path / "out.jsonl"
    files = str(run_dir / f"files-{bulk_stack.prefix}")
    common = [
        str(source),
        "-o",
        str(out),
        "--redis-url",
        redis_url,
        "--prefix",
        bulk_stack.prefix,
        "--files-dir",
        files,
    ]
    first = overspill(*common, "--no-wait")
    assert first.returncode == 0, first.stderr
    batch_id = json.loads(first.stdout)["batch_id"]
    second = overspill(*common)
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    assert summary["batch_id"] == batch_id
    assert summary["request_counts"] == {"total": 201, "completed": 200, "failed": 1}
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 201 and len({line["custom_id"] for line in lines}) == 201
    assert [line["response"]["status_code"] for line in lines if line["custom_id"] == "direct-999"] == [400]
