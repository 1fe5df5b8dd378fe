"""``python -m bench litellm``: remote chat and embeddings through overspill's API beside
LiteLLM's proxy, both in front of the same fake remote, in one run.

Both proxies answer OpenAI's ``POST /v1/chat/completions`` and ``POST /v1/embeddings`` for
models served only by the remote (``stack.fake_remote``, no added latency). Overspill runs as
``overspill up`` runs it: its API (a tenant's API key, the default log level), a worker and
Redis with AOF; LiteLLM's proxy runs with a master key and no database, as its quick start does.
The same closed loop (:mod:`bench.http`, ``USERS`` keep-alive connections) drives each in turn,
alternating, ``REPS`` times. CPU per request counts overspill's API, worker and Redis, and
LiteLLM's proxy process with its children; the fake remote and the load generator are counted
in neither.

LiteLLM is not one of overspill's dependencies (its pins would fight ours): ``make litellm``
installs it in a venv of its own (``.venv-litellm``), or ``OVERSPILL_LITELLM`` names a
``litellm`` executable. Without one the run says so and measures nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from producer.contract import JobKind
from stack.processes import ManagedProcess, free_port
from workers.core.settings import ModelSpec

from . import overflow
from .api import http_loop, start_api
from .cpu import CpuMeter
from .harness import Harness
from .http import Connection
from .runner import save_standalone

ROOT = Path(__file__).resolve().parent.parent
LITELLM_VENV = ROOT / ".venv-litellm"
USERS = 64
REQUESTS = 1_500  # per measured phase
WARMUP = 128
REPS = 3
CHAT = "gpt-4o-mini"
EMBED = "text-embedding-3-small"
REMOTE_KEY = "sk-bench-remote"
PREFIX = "bench-litellm"
# No network: LiteLLM would otherwise fetch its model price map from GitHub at start.
LITELLM_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR"}

Payload = Callable[[str], dict[str, Any]]
KINDS: dict[str, tuple[str, Payload, bytes]] = {
    "chat": (
        "/v1/chat/completions",
        lambda text: {"model": CHAT, "messages": [{"role": "user", "content": text}], "max_tokens": 16},
        b'"choices"',
    ),
    "embed": ("/v1/embeddings", lambda text: {"model": EMBED, "input": text}, b'"embedding"'),
}


def litellm_binary() -> Path | None:
    named = os.environ.get("OVERSPILL_LITELLM")
    path = Path(named) if named else LITELLM_VENV / "bin" / "litellm"
    return path if path.exists() else None


def remote_only_models() -> str:
    """``OVERSPILL_MODELS`` for the worker: the two remote models, nothing local."""
    specs = [
        ModelSpec(name=CHAT, kind=JobKind.chat, remote_only=True),
        ModelSpec(name=EMBED, kind=JobKind.embed, remote_only=True, dim=1536),
    ]
    return json.dumps([s.model_dump(mode="json") for s in specs])


def start_remote(h: Harness) -> str:
    """The fake remote with no added latency; its OpenAI base URL."""
    url, _ = overflow.start_remote(h, 0.0)
    return f"{url}/v1"


def start_overspill(h: Harness, remote: str) -> tuple[dict[str, int], list[Connection]]:
    """A worker serving only the remote models, and an API in front of it."""
    worker = h.start_worker(
        PREFIX,
        OVERSPILL_MODELS=remote_only_models(),
        OVERSPILL_REMOTE_BASE_URL=remote,
        OVERSPILL_REMOTE_API_KEY=REMOTE_KEY,
        OVERSPILL_REMOTE_SAME_MODELS=json.dumps([EMBED]),
    )
    api, conns = start_api(h, PREFIX, USERS)
    return {"api": api.pid, "worker": worker.pid, "redis": h.redis_proc.pid}, conns


def litellm_config(run_dir: Path, remote: str, master_key: str) -> Path:
    """The proxy's config (JSON is YAML): both models on the fake remote, a master key."""
    params = {"api_base": remote, "api_key": REMOTE_KEY}
    config = {
        "model_list": [
            {"model_name": name, "litellm_params": {"model": f"openai/{name}", **params}}
            for name in (CHAT, EMBED)
        ],
        "general_settings": {"master_key": master_key},
        "litellm_settings": {"telemetry": False, "set_verbose": False},
    }
    path = run_dir / "litellm.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path


def start_litellm(h: Harness, binary: Path, remote: str) -> tuple[ManagedProcess, list[Connection]]:
    port = free_port()
    key = "sk-bench-" + secrets.token_urlsafe(16)
    config = litellm_config(h.run_dir, remote, key)
    proc = ManagedProcess(
        "litellm",
        [
            str(binary),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        h.run_dir / "litellm.log",
        env={**os.environ, **LITELLM_ENV},
        ready=lambda: httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=1).status_code == 200,
    )
    h.workers.append(proc)  # stopped with the run's other processes
    proc.start(timeout_s=180)
    return proc, [Connection("127.0.0.1", port, {"Authorization": f"Bearer {key}"}) for _ in range(USERS)]


async def phase(
    conns: list[Connection], kind: str, pids: dict[str, int], tree: frozenset[str]
) -> dict[str, Any]:
    """One closed-loop phase of ``REQUESTS``: its rate, latency and CPU per request."""
    path, payload, expect = KINDS[kind]
    with CpuMeter(pids, with_children=tree) as meter:
        run = await http_loop(conns, REQUESTS, 300.0, path=path, payload=payload, expect=expect)
    per_process = meter.ms_per_item(run.items)
    return {
        **run.summary(),
        "cpu_ms_per_request": round(sum(per_process.values()), 3),
        "cpu_ms_by_process": per_process,
    }


def spread(phases: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [p[key] for p in phases]
    return {"median": round(statistics.median(values), 3), "range": [min(values), max(values)]}


async def compare(
    ours: tuple[dict[str, int], list[Connection]], theirs: tuple[int, list[Connection]]
) -> dict[str, Any]:
    our_pids, our_conns = ours
    their_pid, their_conns = theirs
    systems = {
        "overspill": (our_conns, our_pids, frozenset[str]()),
        "litellm": (their_conns, {"litellm": their_pid}, frozenset({"litellm"})),
    }
    out: dict[str, Any] = {}
    for kind in KINDS:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
        for conns, _, _ in systems.values():  # warm both: connections, caches, the catalogue
            path, payload, expect = KINDS[kind]
            await http_loop(conns, WARMUP, 120.0, path=path, payload=payload, expect=expect)
        for _ in range(REPS):  # alternating, so a slow minute of the host hits both
            for name, (conns, pids, tree) in systems.items():
                runs[name].append(await phase(conns, kind, pids, tree))
        out[kind] = {
            name: {
                "runs": r,
                "requests_per_s": spread(r, "items_per_s"),
                "cpu_ms": spread(r, "cpu_ms_per_request"),
            }
            for name, r in runs.items()
        }
    return out


def headline(details: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, systems in details.items():
        ours, theirs = systems["overspill"], systems["litellm"]
        out[f"api_remote_{kind}_cpu_ms_per_request"] = ours["cpu_ms"]["median"]
        out[f"litellm_remote_{kind}_cpu_ms_per_request"] = theirs["cpu_ms"]["median"]
        out[f"api_remote_{kind}_requests_per_s"] = ours["requests_per_s"]["median"]
        out[f"litellm_remote_{kind}_requests_per_s"] = theirs["requests_per_s"]["median"]
    return out


async def measure(binary: Path) -> dict[str, Any]:
    with Harness.start() as h:
        remote = start_remote(h)
        ours = start_overspill(h, remote)
        proc, their_conns = start_litellm(h, binary, remote)
        version = await asyncio.to_thread(litellm_version, binary)
        try:
            details = await compare(ours, (proc.pid, their_conns))
        finally:
            await asyncio.gather(*(c.close() for c in [*ours[1], *their_conns]))
    return {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "litellm_version": version,
        "users": USERS,
        "requests_per_phase": REQUESTS,
        **headline(details),
        "details": details,
    }


def litellm_version(binary: Path) -> str:
    meta = list(binary.parent.parent.glob("lib/python*/site-packages/litellm-*.dist-info"))
    return meta[0].name.removeprefix("litellm-").removesuffix(".dist-info") if meta else "unknown"


def main() -> dict[str, Any]:
    binary = litellm_binary()
    if binary is None:
        reason = f"no litellm executable: run `make litellm` (installs it in {LITELLM_VENV.name}) or set OVERSPILL_LITELLM"
        print(reason)
        return {"run": False, "reason": reason}
    return save_standalone("litellm", asyncio.run(measure(binary)), also=("api_remote_",))


def section(c: dict[str, Any], profile: dict[str, Any] | None = None) -> list[str]:
    """The docs/benchmarks.md section of a litellm run (bench/report.py adds it when litellm.json
    exists), with ``python -m bench profile --remote``'s summary when there is one."""
    rows = []
    for kind, label in (("chat", "remote chat"), ("embed", "remote embeddings")):
        for name in ("overspill", "litellm"):
            s = c["details"][kind][name]
            rps, cpu = s["requests_per_s"], s["cpu_ms"]
            p99 = statistics.median(r["p99_ms"] for r in s["runs"])
            rows.append(
                f"| {label} | {'overspill API + worker + Redis' if name == 'overspill' else 'LiteLLM proxy'} "
                f"| {rps['median']:,.0f} [{rps['range'][0]:,.0f}–{rps['range'][1]:,.0f}] "
                f"| {cpu['median']} [{cpu['range'][0]}–{cpu['range'][1]}] | {p99:,.0f} |"
            )
    return [
        "## Remote models: overspill's API beside LiteLLM's proxy",
        "",
        f"Command: `make litellm` (installs LiteLLM {c['litellm_version']} in `.venv-litellm`, then runs "
        f"`python -m bench litellm`; measured {c['measured_at']}). Both proxies front the same fake remote "
        f"(no added latency); {c['users']} keep-alive HTTP users, {c['requests_per_phase']:,} requests a "
        "phase, the two proxies alternating, three phases each. CPU per request counts overspill's API, "
        "worker and Redis, and LiteLLM's proxy process; the fake remote and the load generator are in neither.",
        "",
        "| requests | through | requests/s [range] | CPU ms per request [range] | p99 ms |",
        "|---|---|---|---|---|",
        *rows,
        "",
        *(profile_lines(profile) if profile else []),
    ]


def profile_lines(p: dict[str, Any]) -> list[str]:
    from .sections import profile_tables

    return [
        f"Where overspill's side spends it: `python -m bench profile --remote` (measured {p['measured_at']}), "
        f"{p['items']:,} remote chat requests from the same 64 users ({p['items_per_s']:,} requests/s while "
        "sampled), py-spy at 250 Hz on the worker and the API for 10 s (own time):",
        "",
        *profile_tables(p),
        "The same profile before the remote client split its connections over small clients "
        "(`workers/core/shards.py`) had httpcore's pool bookkeeping as the worker's largest "
        "own cost: `_assign_requests_to_connections`, `is_idle`, `has_expired`, `is_socket_readable` and "
        "anyio's `extra` attributes, about 18 % of its samples. The pool walks every connection it holds "
        "each time a request starts or ends; one client of 64 connections with 32 requests in flight "
        "cost the worker 3.5-3.8 ms per remote chat request and gave 256-289 requests/s; clients of 4 "
        "connections cost 1.4-1.5 ms and give 575-645.",
        "",
    ]
