"""compose.yaml run for real: the docs/benchmarks.md section of bench/results/compose.json.

`make compose-test` (tests/compose/) writes the figures: the time to build the images and to
get every service healthy, the jobs that ended ``succeeded`` out of those submitted, and the
jobs lost to a worker replica killed and to Redis restarted under load.
"""

from __future__ import annotations

from typing import Any

ROWS = [
    ("images built, s (`compose_build_s`)", "compose_build_s"),
    ("`up` to every service healthy, s (`compose_up_s`)", "compose_up_s"),
    ("jobs succeeded (`compose_jobs_ok`)", "compose_jobs_ok"),
    ("jobs submitted", "compose_jobs_submitted"),
    (
        "lost to a worker replica SIGKILLed under load (`compose_lost_worker_kill`)",
        "compose_lost_worker_kill",
    ),
    (
        "lost to `docker compose restart redis` under load (`compose_lost_redis_restart`)",
        "compose_lost_redis_restart",
    ),
    ("submissions refused while Redis restarted (503)", "compose_refused_redis_restart"),
]


def section(f: dict[str, Any]) -> list[str]:
    """The section (bench/report.py adds it when compose.json exists)."""
    lines = [
        "## compose.yaml, run for real",
        "",
        f"`make compose-test`, {f.get('measured_at', '?')}: compose.yaml built and started on a private "
        "Docker engine with Debian base images and Triton from the nvidia-pytriton wheel on the CPU "
        "(docs/deploy.md says what it proves and what it does not).",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    lines += [f"| {label} | {f[key]} |" for label, key in ROWS if key in f]
    return [*lines, ""]
