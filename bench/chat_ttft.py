"""``python -m bench.chat_ttft``: time to first token of streamed chat, through the API vs direct.

Starts its own redis-server, tritonserver (model_repository/), one worker and the API (auth
off) on free loopback ports. The same greedy requests (:data:`bench.chat.QUESTIONS`, 32
tokens) are streamed, at 50 % of capacity (4 conversations in flight; the chat model decodes 8
at once), two ways, in short alternating rounds so that the machine's drift touches both alike:

- direct: straight from Triton over gRPC stream_infer (:func:`bench.chat.direct_ttft`), from
  sending the request to its first response;
- through the API: ``POST /v1/chat/completions`` with ``stream: true``, from sending the request
  to the first content chunk read off the socket; the job goes through Redis to the worker and
  its tokens come back on the job's Redis Stream.

Writes ``bench/results/chat_ttft.json``: ``chat_ttft_p50_ms`` and ``chat_ttft_p99_ms`` through
the API, the direct figures, and ``chat_ttft_overhead_p50_ms``, the median over rounds of the
difference between a round's API median and the direct median next to it (on a shared machine
the load swings between rounds by more than the overhead itself), and
``chat_ttft_queue_path_p50_ms``/``_p99_ms``: per request, what the queue path adds apart from
Triton's own time to first token (:func:`_path_ms`), a figure the machine's load moves less.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

from producer.contract import Keys
from stack.processes import free_port, python_process, redis_process, start_triton

from .chat import QUESTIONS, SYSTEM, direct_ttft
from .runner import RESULTS_DIR

ROUNDS = 8
PER_ROUND = 8  # conversations per round and way
CONCURRENCY = 4  # half of the chat model's 8 decode slots
MAX_TOKENS = 32
MODEL = "SmolLM2-135M-Instruct"


@dataclass
class Through:
    """One streamed chat completion through the API."""

    job_id: str
    sent: float  # epoch seconds
    first: float  # epoch seconds, first content chunk read

    @property
    def ttft_ms(self) -> float:
        return (self.first - self.sent) * 1000


async def _api_ttft(url: str, n: int, concurrency: int) -> list[Through]:
    """``n`` streamed chat completions through the API, ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(http: httpx.AsyncClient, i: int) -> Through:
        body = {
            "model": MODEL,
            "messages": [SYSTEM, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": True,
        }
        async with gate:
            started = time.time()
            first = 0.0
            job_id = ""
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    if not job_id:
                        job_id = "job_" + json.loads(line[6:])["id"].removeprefix("chatcmpl-")
                    if not first and '"content":"' in line and '"role"' not in line:
                        first = time.time()
            if not first:
                raise RuntimeError("a stream ended without content")
            return Through(job_id, started, first)

    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        return list(await asyncio.gather(*(one(http, i) for i in range(n))))


def _path_ms(redis_url: str, runs: list[Through]) -> list[float]:
    """Per request, the time the queue path adds to the first token, apart from the backend's:
    submission to the worker's ``running`` event, plus the worker's first delta to the client.

    Both ends are read off the job's stream, whose entry ids are Redis's clock in ms (the same
    host's clock as the client's), so Triton's own time to first token, which swings with the
    machine's load, is left out."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys("bench-ttft")
    out = []
    try:
        for run in runs:
            entries = client.xrange(keys.stream(run.job_id))
            stamps = [(int(i.split("-")[0]), f) for i, f in entries]
            running = next(t for t, f in stamps if '"running"' in f.get("data", ""))
            first = next(t for t, f in stamps if f.get("event") == "delta" and json.loads(f["data"])["text"])
            out.append((running - run.sent * 1000) + (run.first * 1000 - first))
    finally:
        client.close()
    return out


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1)


def measure() -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="overspill-bench-ttft-"))
    redis_port, api_port = free_port(), free_port()
    redis = redis_process(redis_port, run_dir, appendonly=False).start()
    triton = start_triton(run_dir)
    worker = api = None
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    api_url = f"http://127.0.0.1:{api_port}"
    try:
        env = {
            "OVERSPILL_REDIS_URL": redis_url,
            "OVERSPILL_PREFIX": "bench-ttft",
            "OVERSPILL_TRITON_URL": triton.grpc_url,
            "OVERSPILL_TRITON_METRICS_URL": triton.metrics_url,
            "OVERSPILL_JOB_TIMEOUT_S": "120",
            "OVERSPILL_LOG_LEVEL": "WARNING",
        }
        worker = python_process("worker", "workers", run_dir, env).start()
        api_env = {**env, "OVERSPILL_PORT": str(api_port), "OVERSPILL_AUTH": "off"}
        api = python_process("api", "producer.api", run_dir, api_env, ready_url=f"{api_url}/healthz").start()
        asyncio.run(_api_ttft(api_url, 4, 4))  # warm-up: worker connected, model loaded
        direct_ttft(triton.grpc_url, 4, 4, max_tokens=MAX_TOKENS)
        direct: list[float] = []
        through: list[float] = []
        path: list[float] = []
        gaps: list[float] = []
        for _ in range(ROUNDS):
            d = direct_ttft(triton.grpc_url, PER_ROUND, CONCURRENCY, max_tokens=MAX_TOKENS)
            runs = asyncio.run(_api_ttft(api_url, PER_ROUND, CONCURRENCY))
            a = [r.ttft_ms for r in runs]
            path += _path_ms(redis_url, runs)
            direct += d
            through += a
            gaps.append(float(np.median(a) - np.median(d)))
    finally:
        for part in (api, worker, triton.process, redis):
            if part is not None:
                part.stop()
    return {
        "command": "python -m bench.chat_ttft",
        "concurrency": CONCURRENCY,
        "conversations": len(through),
        "max_tokens": MAX_TOKENS,
        "chat_ttft_p50_ms": _pct(through, 50),
        "chat_ttft_p99_ms": _pct(through, 99),
        "chat_ttft_direct_p50_ms": _pct(direct, 50),
        "chat_ttft_direct_p99_ms": _pct(direct, 99),
        "chat_ttft_overhead_p50_ms": round(float(np.median(gaps)), 1),
        "chat_ttft_overhead_rounds_ms": [round(g, 1) for g in gaps],
        "chat_ttft_queue_path_p50_ms": _pct(path, 50),
        "chat_ttft_queue_path_p99_ms": _pct(path, 99),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    result = measure()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "chat_ttft.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
