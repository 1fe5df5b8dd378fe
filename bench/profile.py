"""``python -m bench profile``: where the queue path spends its CPU, sampled with py-spy.

Starts the bench servers (Redis, Triton with ``fixed_cost`` at its default 5 ms), one worker, and
runs ``items`` single-text jobs on the bulk lane (the README's ``submit_many`` + ``iter_results``) from this
process, or with ``--interactive`` 256 concurrent loops of ``submit`` + ``wait`` (P2's load), or
with ``--api`` 64 keep-alive HTTP users of ``POST /v1/embeddings`` on an API process with a
tenants file, at its default log level (P6's HTTP load), or with ``--remote`` the same users
sending chat requests for a model served only by the fake remote (``bench litellm``'s
overspill side). Meanwhile ``py-spy record`` samples the worker and this process (the client),
or the API process, at 250 Hz.
Prints each process's top functions by own time and by inclusive time, and writes the
collapsed stacks (flame-graph input) and a summary to ``bench/results/profile*/``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from producer import Client

from . import api, litellm, load
from .harness import FIXED, Harness
from .http import Connection
from .runner import RESULTS_DIR
from .stats import Run

PREFIX = "bench-profile"
RATE_HZ = 250
TOP = 15


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def record(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` for ``seconds`` into collapsed stacks at ``out``."""
    cmd = [py_spy(), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(RATE_HZ)]
    cmd += ["--format", "raw", "--output", str(out), "--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def frame_name(frame: str) -> str:
    """``func (path/to/module.py:123)`` → ``module.py:func`` (line numbers vary by call site)."""
    func, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{short}:{func}"


def summarize(collapsed: Path) -> dict[str, Any]:
    """Own and inclusive sample shares per function, from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    idle = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";")[1:]]  # the first frame is the thread
        if not frames:
            continue
        total += n
        if frames[-1].endswith(("select", "poll", "epoll", "_run_once")) and "selectors" in frames[-1]:
            idle += n
        own[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n
    share = lambda c: [(name, round(100 * n / max(total, 1), 1)) for name, n in c.most_common(TOP)]  # noqa: E731
    return {"samples": total, "idle_pct": round(100 * idle / max(total, 1), 1), "own": share(own),
            "inclusive": share(inclusive)}  # fmt: skip


USERS = 256  # P2's closed loop
API_USERS = 64  # P6's HTTP users


async def drive(h: Harness, items: int, interactive: bool) -> float:
    async def one_run(n: int, timeout_s: float) -> Run:
        if interactive:
            return await load.closed_loop(client, FIXED, n, USERS, timeout_s=timeout_s)
        return await load.bulk(client, FIXED, n, timeout_s=timeout_s)

    async with Client(h.redis_url, prefix=PREFIX) as client:
        await one_run(1000, 60)  # warm: models, connections, scripts
        start = time.perf_counter()
        run = await one_run(items, 300)
        took = time.perf_counter() - start
    if run.failed:
        raise SystemExit(f"{run.failed} jobs failed during the profile")
    return items / took


async def drive_api(h: Harness, items: int) -> tuple[float, int]:
    """Start an API process; return (requests/s, its pid) once ``items`` requests are answered."""
    proc, conns = api.start_api(h, PREFIX, API_USERS)
    try:
        await api.closed_loop(conns, FIXED, 1000, 60)  # warm
        start = time.perf_counter()
        run = await api.closed_loop(conns, FIXED, items, 300)
        took = time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    if run.failed:
        raise SystemExit(f"{run.failed} requests failed during the profile")
    return items / took, proc.pid


async def drive_remote(conns: list[Connection], items: int) -> float:
    """Remote chat requests through the API (``bench litellm``'s overspill side); requests/s."""
    path, payload, expect = litellm.KINDS["chat"]
    await api.http_loop(conns, 500, 60, path=path, payload=payload, expect=expect)  # warm
    start = time.perf_counter()
    run = await api.http_loop(conns, items, 300, path=path, payload=payload, expect=expect)
    took = time.perf_counter() - start
    await asyncio.gather(*(c.close() for c in conns))
    if run.failed:
        raise SystemExit(f"{run.failed} requests failed during the profile")
    return items / took


def main(
    items: int = 60_000,
    seconds: float = 10.0,
    *,
    interactive: bool = False,
    through_api: bool = False,
    remote: bool = False,
) -> dict[str, Any]:
    mode = " --remote" if remote else " --api" if through_api else " --interactive" if interactive else ""
    out_dir = RESULTS_DIR / ("profile" + mode.replace(" --", "-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    other = "api" if through_api or remote else "client"
    if through_api:
        items = min(items, 30_000)
    if remote:
        items = min(items, 8_000)
    with Harness.start() as h:
        if remote:  # a worker serving remote-only models on the fake remote, and its API
            pids, conns = litellm.start_overspill(h, litellm.start_remote(h))
            worker_pid, other_pid = pids["worker"], pids["api"]
        else:
            worker_pid, other_pid = h.start_worker(PREFIX).pid, os.getpid()

        def driver() -> Any:
            if remote:
                return drive_remote(conns, items)
            return drive_api(h, items) if through_api else drive(h, items, interactive)

        async def run() -> float:
            task = asyncio.create_task(driver())
            await asyncio.sleep(
                2.0 if interactive or not (through_api or remote) else 4.0
            )  # past the warm-up
            pid = next(p.pid for p in h.workers if p.name == "api") if through_api else other_pid
            recorders = [
                record(worker_pid, seconds, out_dir / "worker.txt"),
                record(pid, seconds, out_dir / f"{other}.txt"),
            ]
            done = await task
            for r in recorders:
                await asyncio.to_thread(r.wait)
            return done[0] if isinstance(done, tuple) else done

        rate = asyncio.run(run())
    result = {
        "command": "python -m bench profile" + mode,
        "items": items,
        "items_per_s": round(rate, 1),
        "worker": summarize(out_dir / "worker.txt"),
        other: summarize(out_dir / f"{other}.txt"),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out_dir / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
