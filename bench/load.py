"""Load generators through overspill's public client: bulk, closed loop, open loop.

Each is bounded in count and in time. Latency is measured from submission (closed loop) or
from the scheduled arrival (open loop, so a lagging generator cannot hide queueing) until
the terminal result has been read.

The generator runs the client as a user's program does, garbage collector on: the client's
own collections are part of what a user pays. It keeps only plain numbers per request (its
latency and the envelope's timings), never the envelopes, so its collections stay as cheap as
those of a program that processes each result as it arrives; and it collects once before a
timed phase, so garbage of the previous phase is not charged to this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from producer import Client, JobResult

from .stats import Run

BREAKDOWN = ("queued_ms", "batch_ms", "infer_ms", "total_ms", "batch_size")


@contextlib.contextmanager
def timed_phase() -> Iterator[None]:
    """Collect the previous phase's garbage before this one starts; the collector stays on."""
    gc.collect()
    yield


def texts(n: int) -> list[str]:
    """``n`` distinct short sentences (a fresh nonce, so no cache or dedup can hit)."""
    nonce = secrets.token_hex(4)
    topics = ["rivers", "compilers", "violins", "glaciers", "markets", "comets", "bakeries"]
    return [f"Sentence {i} ({nonce}) is about {topics[i % len(topics)]} and {i * 7}." for i in range(n)]


def body(model: str, text: str) -> dict[str, str]:
    """The README's request: vectors as floats, the OpenAI default (what a user gets unless
    they ask for base64)."""
    return {"model": model, "input": text}


# A succeeded job's envelope timings, in BREAKDOWN order (a tuple of floats: no GC tracking).
Timing = tuple[float, ...]


def timing(result: JobResult) -> Timing:
    t = result.timings
    return (t.queued_ms, t.batch_ms, t.infer_ms, t.total_ms, float(t.batch_size))


@dataclass
class Tally:
    """What a load phase keeps per request: its latency and, if it succeeded, its timings."""

    latencies: list[float] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)
    failed: int = 0

    def add(self, latency_ms: float, result: JobResult | None) -> None:
        """Count one answered request (``result`` None: a direct call, no envelope)."""
        self.latencies.append(latency_ms)
        if result is None:
            return
        if result.status == "succeeded":
            self.timings.append(timing(result))
        else:
            self.failed += 1

    def run(self, items: int, seconds: float) -> Run:
        return Run(items, seconds, self.latencies, self.failed, breakdown(self.timings, self.latencies))


def breakdown(timings: list[Timing], e2e_ms: list[float]) -> dict[str, float]:
    """Mean envelope timings, plus what the client adds after the result is written."""
    if not timings:
        return {}
    out = {k: round(sum(t[i] for t in timings) / len(timings), 3) for i, k in enumerate(BREAKDOWN)}
    if e2e_ms:
        out["e2e_ms"] = round(sum(e2e_ms) / len(e2e_ms), 3)
        out["after_write_ms"] = round(out["e2e_ms"] - out["total_ms"], 3)
    return out


async def bulk(client: Client, model: str, n: int, *, timeout_s: float) -> Run:
    """The README's bulk code: one ``submit_many`` of ``n`` items on the bulk lane, then
    ``iter_results`` as they finish (bounded by ``timeout_s``)."""
    items = texts(n)
    timings: list[Timing] = []
    with timed_phase():
        start = time.perf_counter()
        ids = await client.submit_many([("embed", body(model, t)) for t in items], lane="bulk")
        async for r in client.iter_results(ids, timeout=timeout_s):
            if r.status == "succeeded":
                timings.append(timing(r))
        seconds = time.perf_counter() - start
    failed = n - len(timings)
    return Run(n - failed, seconds, failed=failed, breakdown=breakdown(timings, []))


async def _one(client: Client, model: str, text: str, timeout_s: float) -> JobResult:
    job_id = await client.submit("embed", body(model, text))
    return await client.wait(job_id, timeout=timeout_s)


async def closed_loop(client: Client, model: str, n: int, users: int, *, timeout_s: float) -> Run:
    """``users`` concurrent loops of submit → wait, ``n`` single-item jobs in all."""
    queue = iter(texts(n))
    tally = Tally()

    async def user() -> None:
        for text in queue:
            t0 = time.perf_counter()
            result = await _one(client, model, text, timeout_s)
            tally.add((time.perf_counter() - t0) * 1000, result)

    with timed_phase():
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(user() for _ in range(users))), timeout_s)
        seconds = time.perf_counter() - start
    return tally.run(len(tally.timings), seconds)


Call = Callable[[int], Awaitable[JobResult | None]]


async def open_loop(call: Call, rate: float, seconds: float, *, timeout_s: float) -> Run:
    """Start ``call(i)`` at ``rate`` per second for ``seconds``; latency from scheduled arrival.

    Calls still unfinished ``timeout_s`` after the last arrival are cancelled and count as
    failed. ``call`` returns the envelope (for the breakdown) or None (direct calls).
    """
    n = max(1, int(rate * seconds))
    tally = Tally()
    tasks: set[asyncio.Task[None]] = set()

    async def arrive(i: int, due: float) -> None:
        try:
            result = await call(i)
        except Exception:
            tally.failed += 1
            return
        tally.add((time.perf_counter() - due) * 1000, result)

    with timed_phase():
        start = time.perf_counter()
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(arrive(i, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            _, late = await asyncio.wait(set(tasks), timeout=timeout_s)
            for task in late:
                task.cancel()
            tally.failed += len(late)
        elapsed = time.perf_counter() - start
    return tally.run(len(tally.latencies), elapsed)


def overspill_call(client: Client, model: str, n: int, *, timeout_s: float, **options: object) -> Call:
    """An open-loop call: submit one single-item job with ``options`` and wait for it."""
    items = texts(n)

    async def call(i: int) -> JobResult:
        job_id = await client.submit("embed", body(model, items[i % n]), **options)
        return await client.wait(job_id, timeout=timeout_s)

    return call
