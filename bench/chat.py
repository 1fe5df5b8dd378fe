"""``python -m bench.chat``: chat tokens/s at batch 1 vs batch 8, direct and through overspill.

Starts its own redis-server, tritonserver (the ``chat`` model only) and one worker on free
loopback ports, then measures greedy 64-token completions:
- direct, batch 1: one Triton request per conversation, one after another;
- direct, batch 8: one Triton request carrying 8 conversations;
- overspill: 8 concurrent chat jobs (the micro-batcher merges them into one request).
Writes ``bench/results/chat.json``; ``python -m bench report`` adds it to docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from producer import Client
from stack.processes import free_port, python_process, redis_process, triton_process

from .runner import RESULTS_DIR

QUESTIONS = [
    "Describe the sea.", "Describe a forest.", "Describe a city at night.", "Describe a desert.",
    "Describe a mountain.", "Describe a river.", "Describe a library.", "Describe a market.",
]  # fmt: skip
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
MAX_TOKENS = 64
REPEATS = 3


def _messages(q: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": q}]


def _direct(client: grpcclient.InferenceServerClient, questions: list[str]) -> int:
    """One Triton request for ``questions``; returns the completion tokens generated."""
    params = json.dumps(
        {"max_tokens": MAX_TOKENS, "temperature": 0.0, "top_p": 1.0, "seed": None, "stop": []}
    )
    arrays = {
        "MESSAGES": np.array([json.dumps(_messages(q)).encode() for q in questions], dtype=np.object_),
        "PARAMS": np.array([params.encode()] * len(questions), dtype=np.object_),
    }
    inputs = []
    for name, array in arrays.items():
        t = grpcclient.InferInput(name, [len(questions), 1], "BYTES")
        t.set_data_from_numpy(array.reshape(-1, 1))
        inputs.append(t)
    result = client.infer("chat", inputs, client_timeout=300)
    return int(result.as_numpy("COMPLETION_TOKENS").sum())


def _rate(fn: Any) -> float:
    """Median tokens/s over REPEATS runs of ``fn`` (which returns tokens generated)."""
    rates = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        tokens = fn()
        rates.append(tokens / (time.perf_counter() - started))
    return float(np.median(rates))


async def _through_overspill(redis_url: str) -> tuple[float, float]:
    async with Client(redis_url, prefix="bench-chat") as client:
        rates, sizes = [], []
        for _ in range(REPEATS):
            bodies = [
                {
                    "model": "SmolLM2-135M-Instruct",
                    "messages": _messages(q),
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                }
                for q in QUESTIONS
            ]
            started = time.perf_counter()
            ids = await asyncio.gather(*(client.submit("chat", b) for b in bodies))
            results = await client.wait_many(ids, timeout=300)
            elapsed = time.perf_counter() - started
            rates.append(sum(r.body["usage"]["completion_tokens"] for r in results if r.body) / elapsed)
            sizes.append(float(np.mean([r.timings.batch_size for r in results])))
    return float(np.median(rates)), float(np.median(sizes))


def measure() -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="overspill-bench-chat-"))
    redis_port, http, grpc, metrics = free_port(), free_port(), free_port(), free_port()
    redis = redis_process(redis_port, run_dir, appendonly=False).start()
    triton = triton_process(run_dir, http_port=http, grpc_port=grpc, metrics_port=metrics, models=["chat"])
    worker = None
    try:
        triton.start(timeout_s=180)
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        env = {"OVERSPILL_REDIS_URL": redis_url, "OVERSPILL_PREFIX": "bench-chat",
               "OVERSPILL_TRITON_URL": f"127.0.0.1:{grpc}", "OVERSPILL_JOB_TIMEOUT_S": "120",
               "OVERSPILL_TRITON_METRICS_URL": f"http://127.0.0.1:{metrics}/metrics"}  # fmt: skip
        worker = python_process("worker", "workers", run_dir, env).start()
        direct = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        _direct(direct, QUESTIONS[:1])  # warm-up
        batch1 = _rate(lambda: sum(_direct(direct, [q]) for q in QUESTIONS[:4]))
        batch8 = _rate(lambda: _direct(direct, QUESTIONS))
        ours, size = asyncio.run(_through_overspill(redis_url))
    finally:
        for part in (worker, triton, redis):
            if part is not None:
                part.stop()
    return {
        "command": "python -m bench.chat",
        "max_tokens": MAX_TOKENS,
        "direct_batch1_tok_s": round(batch1, 1),
        "direct_batch8_tok_s": round(batch8, 1),
        "batch8_vs_batch1": round(batch8 / batch1, 2),
        "overspill_8_concurrent_tok_s": round(ours, 1),
        "overspill_mean_batch": round(size, 1),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    result = measure()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "chat.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
