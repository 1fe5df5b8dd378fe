"""The benchmark harness runs end to end at smoke size and records every headline figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.runner import REQUIRED_KEYS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


@pytest.mark.timeout(130)
def test_smoke_run_records_every_figure_as_a_number(tmp_path: Path) -> None:
    """``python -m bench smoke`` writes a results file with all keys, machine and commit."""
    results_before = sorted(RESULTS.glob("*.json"))
    run = subprocess.run(
        [sys.executable, "-m", "bench", "smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads((tmp_path / "latest.json").read_text())
    p4_ran = result["details"]["p4"]["run"]
    for key in REQUIRED_KEYS:
        value = result[key]
        if key.startswith("p4_") and not p4_ran:
            assert value is None, key
        else:
            assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
            assert value > 0 or key == "p4_remote_share", (key, value)
    assert result["commit"] and result["machine"]["cores"] >= 1
    assert isinstance(result["machine"]["gpu"], bool) and result["machine"]["cpu_model"]
    assert sorted(RESULTS.glob("*.json")) == results_before, "smoke must not write to bench/results"
