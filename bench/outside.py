"""``python -m bench.outside``: the bench's P1 and P2 against a stack already running, as an
outside script measures them on what ``overspill up`` starts (this module starts nothing).

Start the stack first (``OVERSPILL_GATEWAY_MODE=triton .venv/bin/overspill up``), then run this
with its Redis and Triton addresses (the defaults are ``overspill up``'s). Each repetition runs,
one after the other on the same Triton: a direct batched ``tritonclient`` loop (64 per request,
4 in flight), the README's bulk code (one ``submit_many(lane="bulk")`` + ``iter_results``) and
256 ``submit`` + ``wait`` loops. Prints one JSON line per repetition: items/s, both ratios, and
this process's CPU per interactive job.

``--rate R`` adds an open loop of single-item jobs at R per second (6 s after a 2 s warm-up) and
reports its p50 and p99; ``--pack-size N`` sets the client's jobs per package, so two runs
compare package sizes at one offered rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from producer import Client

from . import direct, load
from .harness import FIXED, TRITON_NAME

BULK_ITEMS = 12_000
INTERACTIVE_ITEMS = 4_000
USERS = 256
TIMEOUT_S = 300.0


async def repetition(client: Client, triton_url: str, rate: float | None) -> dict[str, float]:
    rates = {
        "direct": (
            await direct.batched(triton_url, TRITON_NAME[FIXED], BULK_ITEMS, 4, timeout_s=TIMEOUT_S)
        ).rate
    }
    rates["bulk"] = (await load.bulk(client, FIXED, BULK_ITEMS, timeout_s=TIMEOUT_S)).rate
    cpu = time.process_time()
    rates["interactive"] = (
        await load.closed_loop(client, FIXED, INTERACTIVE_ITEMS, USERS, timeout_s=TIMEOUT_S)
    ).rate
    out = {k: round(v, 1) for k, v in rates.items()}
    out["bulk_vs_direct"] = round(rates["bulk"] / rates["direct"], 3)
    out["interactive_vs_direct"] = round(rates["interactive"] / rates["direct"], 3)
    out["client_cpu_us_per_interactive_job"] = round((time.process_time() - cpu) / INTERACTIVE_ITEMS * 1e6, 1)
    if rate:
        call = load.overspill_call(client, FIXED, int(rate * 8) + 1, timeout_s=60)
        await load.open_loop(call, rate, 2.0, timeout_s=60)  # warm
        summary = (await load.open_loop(call, rate, 6.0, timeout_s=60)).summary()
        out.update(open_loop_per_s=rate, p50_ms=summary["p50_ms"], p99_ms=summary["p99_ms"])
    return out


async def main(redis_url: str, triton_url: str, reps: int, rate: float | None, pack_size: int | None) -> None:
    options = {"pack_size": pack_size} if pack_size else {}
    async with Client(redis_url, **options) as client:
        await load.bulk(client, FIXED, 256, timeout_s=TIMEOUT_S)  # warm: models, connections, scripts
        for rep in range(reps):
            print(json.dumps({"rep": rep, **await repetition(client, triton_url, rate)}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.outside", description=__doc__)
    parser.add_argument("--redis", default="redis://127.0.0.1:6380/0")
    parser.add_argument("--triton", default="127.0.0.1:8001", help="Triton's gRPC address")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rate", type=float, help="also an open loop at this many jobs/s")
    parser.add_argument("--pack-size", type=int, help="the client's jobs per package")
    a = parser.parse_args()
    asyncio.run(main(a.redis, a.triton, a.reps, a.rate, a.pack_size))
