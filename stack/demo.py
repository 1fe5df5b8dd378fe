"""The demo workload: a few hundred concurrent embedding jobs through the running stack."""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from producer import Client
from workers.routing import ModelCounters, model_counters

_SUBJECTS = [
    "The cat",
    "A rocket",
    "Our database",
    "The river",
    "An old violin",
    "The market",
    "A tired nurse",
]
_VERBS = ["sleeps beside", "launches over", "indexes", "floods", "sings about", "rallies after", "walks past"]
_OBJECTS = [
    "the warm window",
    "the quiet moon",
    "millions of rows",
    "the valley",
    "a lost summer",
    "the news",
    "the ward",
]


def sentences(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} #{i}." for i in range(n)]


async def triton_counters(metrics_url: str) -> dict[str, ModelCounters]:
    async with httpx.AsyncClient(timeout=5) as http:
        return model_counters((await http.get(metrics_url)).text)


async def embedding_workload(
    redis_url: str, prefix: str, metrics_url: str, jobs: int = 300
) -> dict[str, object]:
    texts = sentences(jobs)
    before = (await triton_counters(metrics_url)).get("embedding", ModelCounters())
    async with Client(redis_url, prefix=prefix) as client:
        started = time.perf_counter()
        ids = await asyncio.gather(
            *(client.submit("embed", {"model": "all-MiniLM-L6-v2", "input": t}) for t in texts)
        )
        results = await client.wait_many(ids, timeout=300)
        elapsed = time.perf_counter() - started
    after = (await triton_counters(metrics_url)).get("embedding", ModelCounters())
    executions = after.executions - before.executions
    items = after.inferences - before.inferences
    ok = [r for r in results if r.status == "succeeded"]
    sample = ok[0].body["data"][0]["embedding"][:5] if ok and ok[0].body else []
    return {
        "jobs": jobs,
        "succeeded": len(ok),
        "seconds": round(elapsed, 2),
        "jobs_per_s": round(jobs / elapsed, 1),
        "triton_executions": int(executions),
        "triton_items": int(items),
        "mean_batch": round(items / executions, 1) if executions else 0.0,
        "sample": {"text": texts[0], "first_values": [round(v, 4) for v in sample]},
    }


CHAT_QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "What is 2 + 2?",
                  "Say hello in Spanish.", "What do bees make?", "Name a large ocean."]  # fmt: skip
RERANK_DOCS = [
    "To reset your password, open Settings, choose Security and click 'Forgot password'.",
    "The museum opens at nine and closes at five on weekdays.",
    "If you forgot your password, use the reset link we email to you.",
    "Our bakery sells sourdough bread every morning.",
]


async def mixed_workload(redis_url: str, prefix: str, metrics_url: str) -> dict[str, object]:
    """Chat and rerank jobs side by side, with Triton's batch statistics per model."""
    before = await triton_counters(metrics_url)
    system = {"role": "system", "content": "You are a concise assistant. Answer in one short sentence."}
    chats = [
        {"model": "SmolLM2-135M-Instruct", "messages": [system, {"role": "user", "content": q}],
         "max_tokens": 24, "temperature": 0}
        for q in CHAT_QUESTIONS
    ]  # fmt: skip
    rerank = {
        "model": "minilm-l6-cosine-rerank",
        "query": "how do I reset my password",
        "documents": RERANK_DOCS,
    }
    async with Client(redis_url, prefix=prefix) as client:
        started = time.perf_counter()
        chat_ids = await asyncio.gather(*(client.submit("chat", b) for b in chats))
        rerank_ids = await asyncio.gather(*(client.submit("rerank", rerank) for _ in range(4)))
        # Forced to the remote API (our fake one, unless OVERSPILL_REMOTE_BASE_URL is set).
        remote_ids = await asyncio.gather(*(client.submit("chat", b, route="remote") for b in chats[:2]))
        chat_results = await client.wait_many(chat_ids, timeout=300)
        remote_results = await client.wait_many(remote_ids, timeout=120)
        rerank_results = await client.wait_many(rerank_ids, timeout=300)
        elapsed = time.perf_counter() - started
    await asyncio.sleep(2.2)  # Triton refreshes its metrics about every 2 s
    after = await triton_counters(metrics_url)
    per_model = {}
    for model in ("chat", "reranker"):
        b, a = before.get(model, ModelCounters()), after.get(model, ModelCounters())
        items, execs = a.inferences - b.inferences, a.executions - b.executions
        per_model[model] = {"items": int(items), "executions": int(execs),
                            "mean_batch": round(items / execs, 1) if execs else 0.0}  # fmt: skip
    ok_chats = [r for r in chat_results if r.status == "succeeded" and r.body]
    ok_ranks = [r for r in rerank_results if r.status == "succeeded" and r.body]
    return {
        "seconds": round(elapsed, 2),
        "chat_ok": f"{len(ok_chats)}/{len(chats)}",
        "rerank_ok": f"{len(ok_ranks)}/{len(rerank_ids)}",
        "chat_sample": (CHAT_QUESTIONS[0], ok_chats[0].body["choices"][0]["message"]["content"])
        if ok_chats
        else None,
        "rerank_sample": [(r["index"], round(r["relevance_score"], 3)) for r in ok_ranks[0].body["results"]]
        if ok_ranks
        else None,
        "triton": per_model,
        "routes": sorted(
            {f"{r.route}/{r.route_reason}" for r in [*chat_results, *rerank_results, *remote_results]}
        ),
        "remote_ok": sum(r.status == "succeeded" and r.route == "remote" for r in remote_results),
        "all_ok": len(ok_chats) == len(chats) and len(ok_ranks) == len(rerank_ids),
    }


def print_mixed(report: dict[str, object]) -> None:
    print(
        f"\nchat + rerank jobs ({report['seconds']} s): chat {report['chat_ok']}, rerank {report['rerank_ok']}"
    )
    if report["chat_sample"]:
        q, a = report["chat_sample"]  # type: ignore[misc]
        print(f"  chat          {q!r} -> {a.strip()!r}")
    print(f"  rerank        'how do I reset my password' -> (index, score) {report['rerank_sample']}")
    print(f"  remote        {report['remote_ok']}/2 chat jobs with route=remote answered by the remote API")
    print(f"  routes seen   {', '.join(report['routes'])}")  # type: ignore[arg-type]
    triton = report["triton"]
    assert isinstance(triton, dict)
    for model, stats in triton.items():
        print(
            f"  triton {model:<9}{stats['executions']} executions for {stats['items']} items "
            f"(mean batch {stats['mean_batch']})"
        )


def print_report(report: dict[str, object]) -> None:
    print("\noverspill demo: embedding jobs through Redis -> worker -> Triton")
    print(
        f"  jobs          {report['succeeded']}/{report['jobs']} succeeded in {report['seconds']} s "
        f"({report['jobs_per_s']} jobs/s)"
    )
    print(
        f"  triton        {report['triton_executions']} executions for {report['triton_items']} items "
        f"(mean batch {report['mean_batch']})"
    )
    sample = report["sample"]
    assert isinstance(sample, dict)
    print(f"  sample        {sample['text']!r} -> {sample['first_values']} ...")
