"""The demo workload: a few hundred concurrent embedding jobs through the running stack."""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from producer import Client
from workers.signals import ModelCounters, model_counters

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
