"""``python -m bench console``: the operations console on the stack ``overspill up`` starts.

1. A workload through the README's client code and the HTTP API (local and remote jobs, a
   batch, a webhook that ends a dead letter), then a screenshot of each page into
   ``docs/img/console-*.png`` (Debian's Chromium through Playwright, loopback only).
2. The page-load bound: with the worker stopped, ``BACKLOG`` jobs are queued with
   ``submit_many(lane="bulk")`` and the overview is loaded ``REPS`` times in the browser
   (navigation to the lane depth drawn, in a fresh tab: ``console_overview_ms_1m``; reloading an
   open one: ``console_overview_reload_ms_1m``) and read ``API_READS``
   times over HTTP (``console_overview_api_ms_1m_p50``/``_p99``), beside the same with an
   empty queue, measured in the same run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from producer import Client
from stack.processes import free_port
from stack.stack import Stack, StackSettings

from .runner import save_standalone

BACKLOG = 1_000_000
REPS = 7
API_READS = 50
DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
PAGES = {
    "overview": "#/",
    "jobs": "#/jobs",
    "batches": "#/batches",
    "webhooks": "#/webhooks",
    "usage": "#/usage",
    "policy": "#/policy",
}


def settings(run_dir: Path) -> StackSettings:
    """``overspill up``'s defaults, on free ports and a run directory of its own."""
    return StackSettings(
        run_dir=run_dir,
        redis_port=free_port(),
        triton_http_port=free_port(),
        triton_grpc_port=free_port(),
        triton_metrics_port=free_port(),
        worker_metrics_port=free_port(),
        api_port=free_port(),
        fake_remote_port=free_port(),
    )


async def workload(stack: Stack, api: str) -> dict[str, Any]:
    """What an operator would see on a working day: bulk and interactive, local and remote."""
    async with Client(stack.redis_url, prefix=stack.settings.prefix) as client:
        texts = [f"document {i} of the nightly run " * (1 + i % 5) for i in range(20_000)]
        bulk = await client.submit_many(
            [("embed", {"model": "fixed-cost", "input": t}) for t in texts], lane="bulk"
        )
        live = [
            await client.submit("embed", {"model": "all-MiniLM-L6-v2", "input": f"q{i}"})
            for i in range(300)
        ]  # fmt: skip
        chat = {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 8,
        }
        remote = [
            await client.submit("chat", chat, route="remote") for _ in range(200)
        ]  # the fake remote serves chat
        done = [r async for r in client.iter_results([*bulk, *live, *remote])]
    async with httpx.AsyncClient(base_url=api, timeout=60) as http:
        lines = [
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": "fixed-cost", "input": f"line {i}"}})
            for i in range(5_000)
        ]  # fmt: skip
        upload = await http.post(
            "/v1/files", files={"file": ("in.jsonl", "\n".join(lines).encode())}, data={"purpose": "batch"}
        )
        batch = await http.post("/v1/batches", json={"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"})  # fmt: skip
        # A receiver on an internal address: the SSRF guard refuses it, the delivery is a dead letter.
        hook = {"kind": "embed", "body": {"model": "fixed-cost", "input": "callback"}, "options": {"webhook": {"url": "http://10.255.255.1/hook"}}}  # fmt: skip
        job = (await http.post("/v1/jobs", json=hook)).json()["id"]
        for _ in range(300):
            if (await http.get(f"/v1/batches/{batch.json()['id']}")).json()["status"] == "completed":
                break
            await asyncio.sleep(0.2)
    return {"jobs": len(done), "batch": batch.json()["id"], "webhook_job": job}


def screenshots(
    api: str, work: dict[str, Any], out: Path, suffix: str = "", only: tuple[str, ...] = ()
) -> list[str]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        return []
    shots = {**PAGES, "job": f"#/jobs/{work['webhook_job']}", "batch": f"#/batches/{work['batch']}"}
    shots = {k: v for k, v in shots.items() if not only or k in only}
    saved = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        for name, at in shots.items():
            page.goto(f"{api}/console{at}")
            try:
                page.wait_for_selector("main h1", timeout=10_000)
            except Exception as exc:
                raise RuntimeError(
                    f"console page {name} did not render: {errors} {page.inner_text('main')[:300]}"
                ) from exc
            page.wait_for_timeout(600)
            path = out / f"console-{name}{suffix}.png"
            page.screenshot(path=str(path), full_page=True)
            saved.append(str(path))
        browser.close()
    return saved


def page_loads(api: str) -> tuple[list[float], list[float]]:
    """Milliseconds from navigation to the overview's lane depth drawn: ``REPS`` loads in a
    fresh tab (a new renderer each time), and ``REPS`` reloads of an open one."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        return [], []
    fresh, reloads = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(REPS + 1):  # the first warms the browser's process
            page = browser.new_page()
            started = time.perf_counter()
            page.goto(f"{api}/console#/")
            page.wait_for_selector("[data-testid=depth-bulk]")
            fresh.append((time.perf_counter() - started) * 1000)
            page.close()
        page = browser.new_page()
        page.goto(f"{api}/console#/")
        for _ in range(REPS):
            started = time.perf_counter()
            page.reload()
            page.wait_for_selector("[data-testid=depth-bulk]")
            reloads.append((time.perf_counter() - started) * 1000)
        browser.close()
    return fresh[1:], reloads


def api_reads(api: str) -> list[float]:
    times = []
    with httpx.Client(base_url=api, timeout=30) as http:
        http.get("/v1/console/overview")
        for _ in range(API_READS):
            started = time.perf_counter()
            http.get("/v1/console/overview").raise_for_status()
            times.append((time.perf_counter() - started) * 1000)
    return times


async def queue_backlog(stack: Stack, n: int) -> float:
    async with Client(stack.redis_url, prefix=stack.settings.prefix) as client:
        started = time.perf_counter()
        for first in range(0, n, 100_000):
            batch = [
                ("embed", {"model": "fixed-cost", "input": f"w{i}"})
                for i in range(first, min(first + 100_000, n))
            ]
            await client.submit_many(batch, lane="bulk")
        return time.perf_counter() - started


def settle(redis_url: str, timeout_s: float = 120.0) -> float:
    """Wait for Redis's rewrite of its append-only file after the seeding (a fork copying
    hundreds of MB takes a core): page loads are measured on a quiet machine, not beside it."""
    import redis

    started = time.monotonic()
    with redis.Redis.from_url(redis_url) as r:
        while time.monotonic() - started < timeout_s:
            info = r.info("persistence")
            if not info.get("aof_rewrite_in_progress") and not info.get("rdb_bgsave_in_progress"):
                break
            time.sleep(0.5)
    time.sleep(2.0)  # and let the machine's load fall back
    return time.monotonic() - started


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 1)


def main(backlog: int = BACKLOG) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="overspill-bench-console-") as tmp,
        Stack(settings(Path(tmp))) as stack,
    ):
        api = f"http://127.0.0.1:{stack.settings.api_port}"
        work = asyncio.run(workload(stack, api))
        time.sleep(2)  # one more status report and activity slice
        shots = screenshots(api, work, DOCS_IMG)
        (empty_pages, empty_reloads), empty_api = page_loads(api), api_reads(api)
        for worker in stack.workers:
            worker.stop()
        seed_s = asyncio.run(queue_backlog(stack, backlog))
        settled_s = settle(stack.redis_url)
        (full_pages, full_reloads), full_api = page_loads(api), api_reads(api)
        shots += screenshots(api, work, DOCS_IMG, suffix="-1m", only=("overview",))
        depth = httpx.get(f"{api}/v1/console/overview", timeout=30).json()["lanes"]
    result = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "console_overview_ms_1m": round(statistics.median(full_pages), 1) if full_pages else None,
        "console_overview_ms_empty": round(statistics.median(empty_pages), 1) if empty_pages else None,
        "console_overview_reload_ms_1m": round(statistics.median(full_reloads), 1) if full_reloads else None,
        "console_overview_api_ms_1m_p50": pct(full_api, 0.5),
        "console_overview_api_ms_1m_p99": pct(full_api, 0.99),
        "console_overview_api_ms_empty_p50": pct(empty_api, 0.5),
        "console_backlog_jobs": backlog,
        "details": {
            "page_loads_ms_1m": [round(x, 1) for x in full_pages],
            "page_loads_ms_empty": [round(x, 1) for x in empty_pages],
            "reloads_ms_1m": [round(x, 1) for x in full_reloads],
            "reloads_ms_empty": [round(x, 1) for x in empty_reloads],
            "lanes_at_1m": depth,
            "seed_s": round(seed_s, 1),
            "aof_settled_s": round(settled_s, 1),
            "workload": work,
            "screenshots": shots,
        },
    }
    return save_standalone("console", result)


def section(c: dict[str, Any]) -> list[str]:
    """The docs/benchmarks.md section of a console run (bench/report.py adds it when console.json exists)."""
    d = c["details"]
    return [
        "## Console: the overview with 1,000,000 jobs queued",
        "",
        f"Command: `python -m bench console` (measured {c.get('measured_at', 'n/a')}). The stack `overspill up` "
        f'starts; its worker stopped, then {c["console_backlog_jobs"]:,} jobs queued with `submit_many(lane="bulk")` '
        f"({d['seed_s']} s; Redis's append-only rewrite awaited before measuring). Chromium (Debian's, "
        "through Playwright), from navigation to the lane depth drawn; the overview route read over HTTP "
        "in the same run. Each list is every load of the run, in ms.",
        "",
        "| | 1,000,000 queued | empty queue |",
        "|---|---|---|",
        f"| page, fresh tab (median) | **{c['console_overview_ms_1m']}** {d['page_loads_ms_1m']} | "
        f"{c['console_overview_ms_empty']} {d['page_loads_ms_empty']} |",
        f"| page, reload of an open tab (median) | {c['console_overview_reload_ms_1m']} {d['reloads_ms_1m']} | "
        f"{d['reloads_ms_empty']} |",
        f"| `GET /v1/console/overview` p50 / p99 | {c['console_overview_api_ms_1m_p50']} / "
        f"{c['console_overview_api_ms_1m_p99']} | {c['console_overview_api_ms_empty_p50']} (p50) |",
        "",
        "The server's part does not grow with the backlog (one pipeline of about 36 commands, no key "
        "scanned: docs/console.md); the page's time is Chromium's on 2 cores (a new renderer, the "
        "script, two requests).",
        "",
    ]
