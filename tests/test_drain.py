"""Graceful shutdown: on SIGTERM the API turns unready, finishes what it serves, then exits."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx

from stack.processes import free_port, python_process

EMBED = {"model": "all-MiniLM-L6-v2", "input": "drain"}


async def test_sigterm_makes_readyz_503_while_in_flight_requests_finish(
    run_dir: Path, redis_url: str, prefix: str
) -> None:
    port = free_port()
    env = {
        "OVERSPILL_REDIS_URL": redis_url,
        "OVERSPILL_PREFIX": prefix,  # no worker here: a long-poll waits its full time
        "OVERSPILL_PORT": str(port),
        "OVERSPILL_AUTH": "off",
        "OVERSPILL_SHUTDOWN_DRAIN_S": "1.5",
    }
    url = f"http://127.0.0.1:{port}"
    api = python_process(
        "api", "producer.api", run_dir, env, ready_url=f"{url}/healthz", log_name=f"api-{prefix}"
    )
    api.start(timeout_s=30)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            assert (await http.get("/readyz")).status_code == 200
            job = (await http.post("/v1/jobs", json={"kind": "embed", "body": EMBED})).json()["id"]
            poll = http.get(f"/v1/jobs/{job}", params={"wait": 3})  # in flight across the shutdown

            polling = asyncio.ensure_future(poll)
            await asyncio.sleep(0.3)
            assert api.proc is not None
            api.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.3)
            ready = await http.get("/readyz")
            assert ready.status_code == 503 and ready.json()["down"] == ["api"]
            assert (await http.get("/healthz")).status_code == 200  # still serving in the drain window
            answered = await polling
            answered_at = time.monotonic()
        assert answered.status_code == 200 and answered.json()["status"] == "queued"
        # The long-poll outlived the drain window: uvicorn's shutdown waited for it.
        assert answered_at - signalled > 1.5
        deadline = time.monotonic() + 10
        while api.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert api.poll() == 0, f"the API exited {api.poll()} after draining, not 0"
    finally:
        api.stop()
