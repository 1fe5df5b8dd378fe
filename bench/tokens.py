"""``python -m bench tokens``: token-aware batching on the real embedding model, mixed lengths.

Texts from :mod:`bench.corpus` (log-normal lengths, median about 26 tokens, a few over 200).

- The curve behind the model's ``max_batch_tokens``: the model's own encoder, in process,
  over 768 texts in executions of 64 in arrival order, at each budget (None: one padded batch).
- On the stack as ``overspill up`` runs it (Redis with AOF, the model repository as shipped,
  one worker with the default settings), ``ITEMS`` texts, 3 reps interleaved: a direct
  tritonclient loop in requests of 64 in arrival order, the same with the whole corpus sorted
  by length first (a ceiling no queue reaches: it needs every text before the first request),
  the README's bulk code (``submit_many(lane="bulk")`` + ``iter_results``) →
  ``tokens_bulk_vs_direct``, ``tokens_bulk_vs_sorted``, and 128 concurrent ``submit`` + ``wait``
  loops of one text each → ``tokens_interactive_vs_direct``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import statistics
import time
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpc_aio

from producer import Client
from producer.contract import JobKind
from stack.processes import MODEL_REPOSITORY
from workers.backends.local.handlers import ESTIMATED_TOKENS

from . import corpus, direct
from .harness import EMBED, Harness
from .load import body
from .runner import save_standalone

ITEMS = 1024
REPS = 3
BUDGETS = (None, 8192, 4096, 2048, 1024, 512)


def load_encoder() -> Any:
    """The embedding model's own encoder, loaded by path as Triton loads it."""
    spec = importlib.util.spec_from_file_location(
        "bench_minilm", MODEL_REPOSITORY / "embedding" / "1" / "minilm.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MiniLMEncoder()


def estimate(enc: Any, n: int = 2048) -> dict[str, float]:
    """What the worker's length estimate costs and how well it follows the tokenizer's counts,
    beside what counting with the tokenizer would cost the worker."""
    texts = corpus.texts(n)
    started = time.perf_counter()
    tokens = enc.count_tokens(texts)
    tokenizer_s = time.perf_counter() - started
    guess = ESTIMATED_TOKENS[JobKind.embed]
    started = time.perf_counter()
    estimates = [guess(t) for t in texts]
    estimate_s = time.perf_counter() - started
    return {
        "tokenizer_us_per_text": round(tokenizer_s / n * 1e6, 2),
        "estimate_us_per_text": round(estimate_s / n * 1e6, 2),
        "correlation": round(float(np.corrcoef(estimates, tokens)[0, 1]), 4),
    }


def curve(encoder: Any, n: int = 768) -> dict[str, float]:
    """Texts/s of the encoder in executions of 64 at each ``max_batch_tokens``."""
    texts = corpus.texts(n)
    encoder.encode(texts[:64])
    out = {}
    for budget in BUDGETS:
        encoder.max_batch_tokens = budget
        started = time.perf_counter()
        for i in range(0, n, 64):
            encoder.encode(texts[i : i + 64])
        out[str(budget)] = round(n / (time.perf_counter() - started), 1)
    return out


async def direct_rate(url: str, texts: list[str], concurrency: int = 2) -> float:
    batches = iter([texts[i : i + direct.BATCH] for i in range(0, len(texts), direct.BATCH)])
    client = grpc_aio.InferenceServerClient(url)

    async def lane() -> None:
        for batch in batches:
            await direct._infer(client, "embedding", batch)

    try:
        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(lane() for _ in range(concurrency))), 600)
        return len(texts) / (time.perf_counter() - started)
    finally:
        await client.close()


async def bulk_rate(redis_url: str, prefix: str, texts: list[str]) -> float:
    async with Client(redis_url, prefix=prefix) as client:
        started = time.perf_counter()
        ids = await client.submit_many([("embed", body(EMBED, t)) for t in texts], lane="bulk")
        results = [r async for r in client.iter_results(ids, timeout=600)]
        seconds = time.perf_counter() - started
    failed = sum(r.status != "succeeded" for r in results)
    assert failed == 0, f"{failed} of {len(texts)} jobs did not succeed"
    return len(texts) / seconds


async def interactive_rate(redis_url: str, prefix: str, texts: list[str], users: int = 128) -> float:
    """``users`` concurrent loops of ``submit`` + ``wait``, one text per job (P2's pattern)."""
    queue = iter(texts)
    async with Client(redis_url, prefix=prefix) as client:

        async def user() -> None:
            for text in queue:
                result = await client.wait(await client.submit("embed", body(EMBED, text)), timeout=600)
                assert result.status == "succeeded", result.error

        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(user() for _ in range(users))), 600)
        return len(texts) / (time.perf_counter() - started)


def measure() -> dict[str, Any]:
    runs: dict[str, list[float]] = {"direct": [], "sorted": [], "bulk": [], "interactive": []}
    with Harness.start() as h:
        h.start_worker("tokens")
        url = h.triton.grpc_url
        asyncio.run(direct_rate(url, corpus.texts(64, seed=1)))  # warm up
        for rep in range(REPS):
            texts = [f"r{rep} {t}" for t in corpus.texts(ITEMS)]  # new texts: no cache can hit
            runs["direct"].append(asyncio.run(direct_rate(url, texts)))
            runs["sorted"].append(asyncio.run(direct_rate(url, sorted(texts, key=len))))
            runs["bulk"].append(asyncio.run(bulk_rate(h.redis_url, "tokens", texts)))
            again = [f"i{t}" for t in texts]
            runs["interactive"].append(asyncio.run(interactive_rate(h.redis_url, "tokens", again)))
    enc = load_encoder()
    model_curve = curve(enc)
    length_estimate = estimate(enc)
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "command": "python -m bench tokens",
        "tokens_bulk_vs_direct": round(med["bulk"] / med["direct"], 2),
        "tokens_bulk_vs_sorted": round(med["bulk"] / med["sorted"], 2),
        "tokens_interactive_vs_direct": round(med["interactive"] / med["direct"], 2),
        "details": {
            "items": ITEMS,
            "items_per_s": {k: [round(x, 1) for x in v] for k, v in runs.items()},
            "ratio_runs": [round(b / d, 2) for b, d in zip(runs["bulk"], runs["direct"], strict=True)],
            "encoder_curve": model_curve,
            "length_estimate": length_estimate,
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> dict[str, Any]:
    return save_standalone("tokens", measure())


def section(c: dict[str, Any]) -> list[str]:
    """The docs/benchmarks.md section of a tokens run (bench/report.py adds it when tokens.json exists)."""
    d = c["details"]
    runs = d["items_per_s"]
    curve_row = " | ".join(f"{v:,}" for v in d["encoder_curve"].values())
    return [
        "## Token-aware batching: mixed-length texts on the real embedding model", "",
        f"Command: `python -m bench tokens` (measured {c['measured_at']}). Texts of log-normal length "
        "(`bench/corpus.py`: median about 26 tokens, 90th percentile 67, a few over 200).", "",
        "The model's own encoder in process, 768 texts in executions of 64 in arrival order, at each "
        "`max_batch_tokens` (rows sorted by length and run in groups padded to at most the budget; "
        "none: one batch padded to its longest row), texts/s:", "",
        "| budget | " + " | ".join(d["encoder_curve"]) + " |",
        "|---|" + "---|" * len(d["encoder_curve"]),
        f"| texts/s | {curve_row} |", "",
        f"On the stack `overspill up` starts, {d['items']:,} texts per run, {len(runs['bulk'])} runs "
        "(items/s, each run's figure):", "",
        f"- direct tritonclient, requests of 64 in arrival order: {runs['direct']}",
        f"- direct, the whole corpus sorted by length first (a ceiling: it needs every text before "
        f"the first request): {runs['sorted']}",
        f"- overspill bulk, the README's code: {runs['bulk']}",
        f"- overspill interactive, 128 concurrent `submit` + `wait` loops of one text each: "
        f"{runs.get('interactive', 'not measured')}", "",
        f"Bulk ÷ direct in arrival order **{c['tokens_bulk_vs_direct']}** (per run {d['ratio_runs']}); "
        f"bulk ÷ sorted direct **{c['tokens_bulk_vs_sorted']}**. The worker queues each bulk chunk's "
        "texts shortest first, so its requests hold texts of similar length; interactive jobs, one "
        "text each, are grouped by the batcher's look-ahead (the oldest waiting text and those nearest "
        "its length among the next 256); the model groups whatever one execution holds (requests "
        "merged from several workers too)."
        + (f" Interactive ÷ direct **{c['tokens_interactive_vs_direct']}**."
           if "tokens_interactive_vs_direct" in c else ""), "",
        *([f"The worker estimates a text's tokens from its length: "
           f"{d['length_estimate']['estimate_us_per_text']} µs per text, correlation "
           f"{d['length_estimate']['correlation']} with the tokenizer's counts, where counting with "
           f"the tokenizer (batched) would cost it {d['length_estimate']['tokenizer_us_per_text']} µs.",
           ""] if "length_estimate" in d else []),
    ]  # fmt: skip
