"""``python -m bench.chat``: chat tokens/s and time to first token, direct and through overspill.

Starts its own redis-server, tritonserver and one worker on free loopback ports. Triton serves a
temporary model repository with copies of the decoupled ``chat`` model per scheduling and
engine (``chat``/``chat_static`` on SmolLM2, ``chat_fixed``/``chat_fixed_static`` on the
fixed-step stand-in), each with its own engine. Measured, greedy:

- direct, batch 1: one 64-token conversation streamed at a time;
- direct, batch 8: 8 conversations streamed concurrently (they share the decode steps);
- overspill: 8 concurrent chat jobs through the queue and a worker;
- continuous vs static: 32 conversations at once (4x the 8 slots) with mixed ``max_tokens``
  (8-128, a fixed seeded list), two runs per model in the order C S S C: completion tokens/s;
  on SmolLM2 (compute-bound on CPU: a step of 8 costs several steps of 1) and on the same
  scheduler with the fixed-step engine (``chat_fixed``: a step costs 20 ms for any batch up
  to the 8 slots, as memory-bound decoding on a GPU; 128 conversations, cheap there, so the
  drain of the last ones weighs little) → ``..._fixed_step``;
- time to first token streamed straight from Triton (:func:`direct_ttft`) at 4 conversations
  in flight, half the slots.

Writes ``bench/results/chat.json``; ``python -m bench report`` adds it to docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient

from producer import Client
from stack.processes import MODEL_REPOSITORY, free_port, python_process, redis_process, triton_process

from .runner import RESULTS_DIR

QUESTIONS = [
    "Describe the sea.", "Describe a forest.", "Describe a city at night.", "Describe a desert.",
    "Describe a mountain.", "Describe a river.", "Describe a library.", "Describe a market.",
]  # fmt: skip
STORIES = [f"Tell a long story about {t}." for t in (
    "a dragon", "a lighthouse keeper", "a lost robot", "two rival bakers", "a comet",
    "a mountain village", "a sailor", "an old clock",
)]  # fmt: skip
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
MAX_TOKENS = 64
REPEATS = 3
SATURATION = 32  # conversations at once, 4x the model's 8 slots
_rng = random.Random(17)
MIXED_MAX_TOKENS = [_rng.randint(8, 128) for _ in range(SATURATION)]
TTFT_N, TTFT_CONCURRENCY = 32, 4
RUN_TIMEOUT_S = 900  # one measured run, at most
FIXED_STEP_MS = 20  # the stand-in's decode step (its config.pbtxt default)
# The stand-in's runs are cheap, so they are long: 128 conversations (16x the slots), where the
# drain of the last ones (the same for both schedulings) is a small part of a run.
_fixed_rng = random.Random(18)
FIXED_MAX_TOKENS = [_fixed_rng.randint(8, 128) for _ in range(128)]


def _messages(q: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": q}]


def _params(max_tokens: int) -> str:
    return json.dumps({"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0, "seed": None, "stop": []})


@dataclass
class Streamed:
    """One conversation streamed from Triton."""

    ttft_s: float  # from sending the request to its first response
    total_s: float
    text: str
    completion_tokens: int


async def stream_direct(
    client: grpcclient.InferenceServerClient, question: str, max_tokens: int, model: str = "chat"
) -> Streamed:
    """Stream one greedy conversation from the decoupled chat model (one stream call)."""
    inputs = []
    for name, value in (("MESSAGES", json.dumps(_messages(question))), ("PARAMS", _params(max_tokens))):
        t = grpcclient.InferInput(name, [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[value.encode()]], dtype=np.object_))
        inputs.append(t)
    finished = asyncio.Event()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": model, "inputs": inputs}
        await finished.wait()

    started = time.perf_counter()
    first = 0.0
    parts: list[str] = []
    call = client.stream_infer(requests(), stream_timeout=300)
    try:
        async for result, error in call:
            if error is not None:
                raise error
            first = first or time.perf_counter()
            parts.append(result.as_numpy("TEXT").reshape(-1)[0].decode())
            if err := result.as_numpy("ERROR").reshape(-1)[0].decode():
                raise RuntimeError(f"chat model error: {err}")
            if result.as_numpy("FINISH_REASON").reshape(-1)[0]:
                tokens = int(result.as_numpy("COMPLETION_TOKENS").reshape(-1)[0])
                return Streamed(first - started, time.perf_counter() - started, "".join(parts), tokens)
    finally:
        finished.set()
        call.cancel()
    raise RuntimeError("the stream ended before the final response")


async def _many(
    url: str, jobs: list[tuple[str, int]], concurrency: int, model: str = "chat"
) -> list[Streamed]:
    """Stream ``jobs`` (question, max_tokens) with at most ``concurrency`` in flight, in order."""
    client = grpcclient.InferenceServerClient(url)
    gate = asyncio.Semaphore(concurrency)

    async def one(question: str, max_tokens: int) -> Streamed:
        async with gate:
            return await stream_direct(client, question, max_tokens, model)

    try:
        return list(await asyncio.gather(*(one(q, m) for q, m in jobs)))
    finally:
        await client.close()


def direct_ttft(
    url: str, n: int, concurrency: int, *, max_tokens: int = 32, model: str = "chat"
) -> list[float]:
    """Time to first token in ms of ``n`` greedy conversations streamed straight from Triton.

    ``url`` is Triton's gRPC host:port; ``concurrency`` conversations are in flight at a time
    (each its own stream call, the questions cycling through :data:`QUESTIONS`). The same
    requests sent through the API give the API's overhead on the first token.
    """
    jobs = [(QUESTIONS[i % len(QUESTIONS)], max_tokens) for i in range(n)]
    return [s.ttft_s * 1000 for s in asyncio.run(_many(url, jobs, concurrency, model))]


def _rate(
    url: str, jobs: list[tuple[str, int]], concurrency: int, model: str = "chat", repeats: int = REPEATS
) -> tuple[float, list[str]]:
    """Completion tokens/s of ``jobs`` (median of ``repeats`` runs) and the texts of the last run."""
    rates, texts = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        done = asyncio.run(asyncio.wait_for(_many(url, jobs, concurrency, model), RUN_TIMEOUT_S))
        rates.append(sum(s.completion_tokens for s in done) / (time.perf_counter() - started))
        texts = [s.text for s in done]
    return float(np.median(rates)), texts


async def _through_overspill(redis_url: str) -> tuple[float, float]:
    async with Client(redis_url, prefix="bench-chat") as client:
        rates, sizes = [], []
        for _ in range(REPEATS):
            bodies = [
                {"model": "SmolLM2-135M-Instruct", "messages": _messages(q), "max_tokens": MAX_TOKENS,
                 "temperature": 0}
                for q in QUESTIONS
            ]  # fmt: skip
            started = time.perf_counter()
            ids = await asyncio.gather(*(client.submit("chat", b) for b in bodies))
            results = await client.wait_many(ids, timeout=300)
            elapsed = time.perf_counter() - started
            rates.append(sum(r.body["usage"]["completion_tokens"] for r in results if r.body) / elapsed)
            sizes.append(float(np.mean([r.timings.batch_size for r in results])))
    return float(np.median(rates)), float(np.median(sizes))


# Copies of the chat model: (name, scheduling, engine). fixed_step is the GPU-like stand-in.
COPIES = (
    ("chat", "continuous", "smollm"),
    ("chat_static", "static", "smollm"),
    ("chat_fixed", "continuous", "fixed_step"),
    ("chat_fixed_static", "static", "fixed_step"),
)


def model_repository(run_dir: Path, copies: tuple[tuple[str, str, str], ...] = COPIES) -> Path:
    """``chat`` as configured, and copies with static scheduling and with the fixed-step engine."""
    repo = run_dir / "models"
    for name, scheduling, engine in copies:
        model = repo / name
        model.mkdir(parents=True)
        shutil.copytree(MODEL_REPOSITORY / "chat" / "1", model / "1")
        config = (MODEL_REPOSITORY / "chat" / "config.pbtxt").read_text()
        config = (
            config.replace('name: "chat"', f'name: "{name}"')
            .replace(
                '{ key: "scheduling", value: { string_value: "continuous" } }',
                f'{{ key: "scheduling", value: {{ string_value: "{scheduling}" }} }}',
            )
            .replace(
                '{ key: "engine", value: { string_value: "smollm" } }',
                f'{{ key: "engine", value: {{ string_value: "{engine}" }} }}',
            )
        )
        assert f'string_value: "{scheduling}"' in config, "config.pbtxt has no scheduling parameter"
        assert f'string_value: "{engine}"' in config, "config.pbtxt has no engine parameter"
        (model / "config.pbtxt").write_text(config)
    return repo


def _scheduling(
    url: str,
    continuous: str = "chat",
    static: str = "chat_static",
    suffix: str = "",
    budgets: list[int] = MIXED_MAX_TOKENS,
) -> dict[str, Any]:
    """Continuous vs static with every conversation submitted at once, on the same mixed
    requests, in rounds ordered continuous, static, static, continuous, so that a change of
    machine load hits both."""
    jobs = [(STORIES[i % len(STORIES)], m) for i, m in enumerate(budgets)]
    rates: dict[str, list[float]] = {continuous: [], static: []}
    texts: dict[str, list[str]] = {}
    for model in (continuous, static, static, continuous):
        rate, texts[model] = _rate(url, jobs, len(jobs), model, repeats=1)
        rates[model].append(rate)
    c, st = float(np.mean(rates[continuous])), float(np.mean(rates[static]))
    return {
        f"chat_tokens_per_s_continuous{suffix}": round(c, 1),
        f"chat_tokens_per_s_static{suffix}": round(st, 1),
        f"chat_tokens_per_s_continuous_vs_static{suffix}": round(c / st, 2),
        f"continuous_static_same_texts{suffix}": texts[continuous] == texts[static],
    }


def measure() -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="overspill-bench-chat-"))
    redis_port, http, grpc, metrics = free_port(), free_port(), free_port(), free_port()
    redis = redis_process(redis_port, run_dir, appendonly=False).start()
    triton = triton_process(
        run_dir,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        model_repository=model_repository(run_dir),
    )
    worker = None
    url = f"127.0.0.1:{grpc}"
    try:
        triton.start(timeout_s=180)
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        env = {"OVERSPILL_REDIS_URL": redis_url, "OVERSPILL_PREFIX": "bench-chat",
               "OVERSPILL_TRITON_URL": url, "OVERSPILL_JOB_TIMEOUT_S": "120",
               "OVERSPILL_TRITON_METRICS_URL": f"http://127.0.0.1:{metrics}/metrics"}  # fmt: skip
        worker = python_process("worker", "workers", run_dir, env).start()
        for name, _, _ in COPIES:  # warm-up, every model
            asyncio.run(_many(url, [(QUESTIONS[0], 8)], 1, name))
        scheduling = _scheduling(url)
        fixed = _scheduling(url, "chat_fixed", "chat_fixed_static", "_fixed_step", FIXED_MAX_TOKENS)
        ttft = direct_ttft(url, TTFT_N, TTFT_CONCURRENCY)
        batch1, _ = _rate(url, [(q, MAX_TOKENS) for q in QUESTIONS[:4]], 1)
        batch8, _ = _rate(url, [(q, MAX_TOKENS) for q in QUESTIONS], 8)
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
        **scheduling,
        "continuous_vs_static_conversations": SATURATION,
        "continuous_vs_static_max_tokens": MIXED_MAX_TOKENS,
        **fixed,
        "fixed_step_ms": FIXED_STEP_MS,
        "fixed_step_conversations": len(FIXED_MAX_TOKENS),
        "chat_ttft_direct_p50_ms": round(float(np.percentile(ttft, 50)), 1),
        "chat_ttft_direct_p99_ms": round(float(np.percentile(ttft, 99)), 1),
        "chat_ttft_direct_concurrency": TTFT_CONCURRENCY,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],  # other work on the host
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def measure_fixed_step() -> dict[str, Any]:
    """Only the fixed-step stand-in's continuous vs static (a minute, no SmolLM2 runs)."""
    run_dir = Path(tempfile.mkdtemp(prefix="overspill-bench-chat-"))
    http, grpc, metrics = free_port(), free_port(), free_port()
    copies = tuple(c for c in COPIES if c[2] == "fixed_step")
    repo = model_repository(run_dir, copies)
    triton = triton_process(
        run_dir, http_port=http, grpc_port=grpc, metrics_port=metrics, model_repository=repo
    )
    url = f"127.0.0.1:{grpc}"
    try:
        triton.start(timeout_s=180)
        for name, _, _ in copies:
            asyncio.run(_many(url, [(QUESTIONS[0], 8)], 1, name))
        fixed = _scheduling(url, "chat_fixed", "chat_fixed_static", "_fixed_step", FIXED_MAX_TOKENS)
    finally:
        triton.stop()
    return {**fixed, "fixed_step_ms": FIXED_STEP_MS, "fixed_step_conversations": len(FIXED_MAX_TOKENS),
            "fixed_step_measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip


def main() -> None:
    """``python -m bench.chat`` measures everything; ``--fixed-step`` only the stand-in, merged
    into the last results."""
    path = RESULTS_DIR / "chat.json"
    if "--fixed-step" in sys.argv[1:]:
        result = {**(json.loads(path.read_text()) if path.exists() else {}), **measure_fixed_step()}
    else:
        result = measure()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
