"""The producer commands (``overspill submit|status|cancel|bulk``) as a script sees them.

Every test runs the installed ``overspill`` entry point as a subprocess against a real Redis
(the session's redis-server) on a fresh key prefix; jobs that must run get a real worker on
the session's Triton. The promises: an error is one JSON line on stderr, never a traceback
(unless ``--debug``), and the exit code says what happened. The numbers below are the
documented interface, so they are written out here rather than imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stack.processes import ROOT, free_port
from tests.conftest import Triton, WorkerFactory

OK, BAD_INPUT, USAGE, JOB_FAILED, NOT_CANCELLED, UNREACHABLE, TIMEOUT = 0, 1, 2, 3, 4, 5, 6
OVERSPILL = Path(sys.executable).parent / "overspill"
FIXED = "fixed-cost"


def overspill(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    # OVERSPILL_* from the caller's shell would change the defaults under test.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    return subprocess.run(
        [str(OVERSPILL), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**clean, **(env or {})},
    )


def error_of(run: subprocess.CompletedProcess[str], *, only_line: bool = True) -> dict[str, str]:
    """The ``{"type", "message"}`` of the run's error line (the last on stderr)."""
    assert "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines, f"nothing on stderr (exit {run.returncode})"
    if only_line:
        assert len(lines) == 1, run.stderr
    error: dict[str, str] = json.loads(lines[-1])["error"]
    assert set(error) == {"type", "message"} and error["message"], error
    return error


def where(redis_url: str, prefix: str) -> list[str]:
    return ["--redis-url", redis_url, "--prefix", prefix]


def embed(text: str, model: str = FIXED) -> str:
    return json.dumps({"model": model, "input": text})


def jsonl(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def bad_body_line(i: int) -> dict[str, Any]:
    """A request line every batch accepts and every worker would refuse (an empty input list)."""
    body = {"model": FIXED, "input": []}
    return {"custom_id": f"r-{i}", "method": "POST", "url": "/v1/embeddings", "body": body}


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("body", ["{not json", "@missing.json"], ids=["not-json", "missing-file"])
def test_a_body_that_cannot_be_read_is_bad_input_not_a_traceback(
    body: str, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    run = overspill("submit", "embed", body, *where(redis_url, prefix), cwd=tmp_path)
    assert run.returncode == BAD_INPUT
    error = error_of(run)
    assert error["type"] == "invalid_request"
    if body.startswith("@"):
        assert "missing.json" in error["message"]


@pytest.mark.parametrize("how", ["flag", "group-flag", "env"])
def test_debug_adds_the_traceback_and_keeps_the_exit_code(how: str, redis_url: str, prefix: str) -> None:
    args = ["submit", "embed", "{not json", *where(redis_url, prefix)]
    env = {}
    if how == "flag":
        args.append("--debug")
    elif how == "group-flag":
        args.insert(0, "--debug")
    else:
        env["OVERSPILL_DEBUG"] = "1"
    run = overspill(*args, env=env)
    assert run.returncode == BAD_INPUT
    assert "Traceback" in run.stderr and "JSONDecodeError" in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert json.loads(last)["error"]["type"] == "invalid_request"


@pytest.mark.parametrize("command", ["submit", "status", "cancel", "bulk"])
def test_the_exit_codes_are_in_every_commands_help(command: str) -> None:
    run = overspill(command, "--help")
    assert run.returncode == OK
    text = " ".join(run.stdout.split())
    assert "Exit codes" in text
    meanings = ["1 bad input", "2 usage", "3 job", "4 cancel did nothing", "5 Redis or API", "6 timed out"]
    for meaning in meanings:
        assert meaning in text, (meaning, run.stdout)
    assert overspill(command, "--no-such-option").returncode == USAGE  # click's own code stays


# ---------------------------------------------------------------------------- unreachable


def test_an_unreachable_redis_exits_5_from_every_command(tmp_path: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    source = tmp_path / "in.jsonl"
    source.write_text(jsonl([bad_body_line(0)]))
    runs = {
        "submit": overspill("submit", "embed", embed("x"), "--redis-url", dead),
        "submit --no-wait": overspill("submit", "embed", embed("x"), "--no-wait", "--redis-url", dead),
        "status": overspill("status", "job_000000000000000000000000", "--redis-url", dead),
        "cancel": overspill("cancel", "job_000000000000000000000000", "--redis-url", dead),
        "bulk": overspill(
            "bulk",
            str(source),
            "-o",
            str(tmp_path / "out.jsonl"),
            "--redis-url",
            dead,
            "--files-dir",
            str(tmp_path / "files"),
        ),  # fmt: skip
    }
    for name, run in runs.items():
        assert run.returncode == UNREACHABLE, (name, run.returncode, run.stderr)
        error = error_of(run, only_line=name != "bulk")
        assert error["type"] == "unreachable", (name, error)


def test_an_unreachable_api_exits_5(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(jsonl([bad_body_line(0)]))
    api = f"http://127.0.0.1:{free_port()}"
    run = overspill("bulk", str(source), "-o", str(tmp_path / "out.jsonl"), "--api-url", api)
    assert run.returncode == UNREACHABLE
    error = error_of(run, only_line=False)
    assert error["type"] == "unreachable" and api in error["message"]


def test_a_redis_password_never_reaches_the_error_line(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(jsonl([bad_body_line(0)]))
    dead = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    run = overspill(
        "bulk", str(source), "-o", str(tmp_path / "out.jsonl"), "--redis-url", dead,
        "--files-dir", str(tmp_path / "files"),
    )  # fmt: skip
    assert run.returncode == UNREACHABLE
    assert "s3cret" not in run.stderr + run.stdout
    assert error_of(run, only_line=False)["type"] == "unreachable"


# ---------------------------------------------------------------------------- outcomes


def test_a_wait_that_runs_out_exits_6(redis_url: str, prefix: str) -> None:
    """No worker serves the prefix, so its jobs stay queued past every wait."""
    run = overspill("submit", "embed", embed("never run"), "--timeout", "0.5", *where(redis_url, prefix))
    assert run.returncode == TIMEOUT
    assert error_of(run)["type"] == "timeout"
    job_id = overspill(
        "submit", "embed", embed("queued"), "--no-wait", *where(redis_url, prefix)
    ).stdout.strip()
    status = overspill("status", job_id, "--wait", "0.5", *where(redis_url, prefix))
    assert status.returncode == TIMEOUT
    assert json.loads(status.stdout)["status"] == "queued"  # the envelope as it stands
    error = error_of(status)
    assert error["type"] == "timeout" and job_id in error["message"]
    assert overspill("status", job_id, *where(redis_url, prefix)).returncode == OK  # no wait, no timeout


def test_a_job_that_fails_exits_3_from_submit_and_status(
    redis_url: str, prefix: str, start_worker: WorkerFactory
) -> None:
    start_worker()
    run = overspill(
        "submit", "embed", embed("x", model="no-such-model"), "--timeout", "60", *where(redis_url, prefix)
    )
    assert run.returncode == JOB_FAILED
    envelope = json.loads(run.stdout)
    assert envelope["status"] == "failed" and envelope["error"]["type"] == "model_not_found"
    error = error_of(run)
    assert error["type"] == "job_failed" and "model_not_found" in error["message"]
    status = overspill("status", envelope["id"], *where(redis_url, prefix))
    assert status.returncode == JOB_FAILED and json.loads(status.stdout)["status"] == "failed"


def test_cancel_exits_0_for_a_cancelled_job_and_4_when_it_did_nothing(
    redis_url: str, prefix: str, start_worker: WorkerFactory
) -> None:
    queued = overspill("submit", "embed", embed("to cancel"), "--no-wait", *where(redis_url, prefix))
    job_id = queued.stdout.strip()
    first = overspill("cancel", job_id, *where(redis_url, prefix))
    assert first.returncode == OK and json.loads(first.stdout)["status"] == "cancelled"
    again = overspill("cancel", job_id, *where(redis_url, prefix))
    assert again.returncode == OK, "cancelling a cancelled job is harmless, as in the API"
    assert overspill("status", job_id, *where(redis_url, prefix)).returncode == JOB_FAILED

    start_worker()
    done = overspill("submit", "embed", embed("finished first"), "--timeout", "60", *where(redis_url, prefix))
    assert done.returncode == OK, done.stderr
    finished_id = json.loads(done.stdout)["id"]
    late = overspill("cancel", finished_id, *where(redis_url, prefix))
    assert late.returncode == NOT_CANCELLED
    assert json.loads(late.stdout) == {"id": finished_id, "status": "succeeded"}
    assert error_of(late)["type"] == "job_finished"


def test_cancel_of_a_running_job_exits_4(
    redis_url: str, prefix: str, start_worker: WorkerFactory, triton: Triton
) -> None:
    triton.set_exec_ms(6000)  # one execution outlasts the cancel
    try:
        start_worker()
        time.sleep(1.5)  # the model re-reads its cost within 0.5 s; margin for a busy machine
        job_id = overspill(
            "submit", "embed", embed(f"slow {prefix}"), "--no-wait", *where(redis_url, prefix)
        ).stdout.strip()
        deadline = time.monotonic() + 30
        while json.loads(overspill("status", job_id, *where(redis_url, prefix)).stdout)["status"] == "queued":
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.1)
        run = overspill("cancel", job_id, *where(redis_url, prefix))
    finally:
        triton.set_exec_ms(5)
    assert run.returncode == NOT_CANCELLED
    assert json.loads(run.stdout)["status"] == "running"
    assert error_of(run)["type"] == "job_running"


# ---------------------------------------------------------------------------- bulk


def test_a_batch_that_fails_exits_3(redis_url: str, prefix: str, tmp_path: Path) -> None:
    """A duplicate custom_id fails the whole batch at validation; no worker is needed."""
    source = tmp_path / "in.jsonl"
    source.write_text(jsonl([bad_body_line(0), bad_body_line(0)]))
    run = overspill(
        "bulk", str(source), "-o", str(tmp_path / "out.jsonl"), *where(redis_url, prefix),
        "--files-dir", str(tmp_path / "files"),
    )  # fmt: skip
    assert run.returncode == JOB_FAILED
    assert json.loads(run.stdout)["status"] == "failed"  # the summary still goes to stdout
    error = error_of(run, only_line=False)
    assert error["type"] == "batch_failed" and "duplicate_custom_id" in error["message"]


def test_bulk_resumed_from_another_directory_names_the_file_store_it_looked_in(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The default file store is ./.run/files of the current directory, made absolute; a batch
    whose files another directory holds is reported as that, not as an unreachable server."""
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(jsonl([bad_body_line(i) for i in range(3)]))
    common = [str(source), "-o", str(out), *where(redis_url, prefix)]

    # Every line fails alone (no job to run), so this one step finishes the batch here.
    started = overspill("bulk", *common, "--no-wait", cwd=first_dir)
    assert started.returncode == OK, started.stderr
    assert json.loads(started.stdout)["status"] == "completed"

    elsewhere = overspill("bulk", *common, cwd=second_dir)
    assert elsewhere.returncode == BAD_INPUT
    error = error_of(elsewhere, only_line=False)
    assert error["type"] == "file_store_mismatch", error
    assert str(Path(os.path.realpath(second_dir)) / ".run" / "files") in error["message"]
    assert "--files-dir" in error["message"] and "reach" not in error["message"]
    assert not out.exists() and not list(tmp_path.glob("*.part"))

    first_store = Path(os.path.realpath(first_dir)) / ".run" / "files"
    assert json.loads(started.stdout)["files_dir"] == str(first_store)  # said, and absolute
    pointed = overspill("bulk", *common, "--files-dir", str(first_store), cwd=second_dir)
    assert pointed.returncode == OK, pointed.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["r-0", "r-1", "r-2"]
    assert {line["response"]["status_code"] for line in lines} == {400}


def test_overspill_up_reads_the_workers_own_metrics_port_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OVERSPILL_METRICS_PORT`` is the worker's setting; ``overspill up`` must not override it."""
    from stack.stack import StackSettings

    monkeypatch.setenv("OVERSPILL_METRICS_PORT", "9555")
    assert StackSettings().worker_metrics_port == 9555
    monkeypatch.delenv("OVERSPILL_METRICS_PORT")
    monkeypatch.setenv("OVERSPILL_WORKER_METRICS_PORT", "9666")  # the older name still works
    assert StackSettings().worker_metrics_port == 9666
