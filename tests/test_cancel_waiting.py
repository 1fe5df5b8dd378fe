"""Cancelling a job whose inputs wait in a worker's batcher takes them out before they are sent.

Real worker, real Triton (the fixed-cost model at 300 ms an execution): one large embedding
job fills the batcher's queue, a second one waits behind it, and the second is cancelled while
its package runs. The unit part drives a MicroBatcher directly.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from producer import Client
from producer.contract import Status
from tests.conftest import Triton, WorkerFactory
from workers.backends.local.batcher import MicroBatcher
from workers.core.errors import StreamCancelled
from workers.routing.signals import model_counters

# The first job: 16 executions of 64 inputs at EXEC_MS each, so the second job's inputs wait
# seconds behind them, whatever the moment the test sees the first batch done.
AHEAD = 1024
EXEC_MS = 300


def inferences(triton: Triton) -> float:
    text = httpx.get(triton.metrics_url, timeout=5).text
    return model_counters(text)["fixed_cost"].inferences


def embed(n: int, tag: str) -> dict[str, object]:
    return {"model": "fixed-cost", "input": [f"{tag} text {i}" for i in range(n)]}


async def test_a_batcher_drops_the_waiting_items_of_the_jobs_named() -> None:
    sent: list[list[str]] = []

    async def infer(items: list[str]) -> list[str]:
        sent.append(items)
        await asyncio.sleep(0.05)
        return items

    batcher: MicroBatcher[str] = MicroBatcher("m", infer, max_batch=2, max_inflight=1, flush_when_free=True)
    first = asyncio.create_task(batcher.submit_many(["a1", "a2"], owners=["a", "a"]))
    second = asyncio.create_task(batcher.submit_many(["b1", "b2", "b3"], owners=["b", "b", "b"]))
    await asyncio.sleep(0.01)  # a's items are out, b's wait
    assert batcher.waiting_owners() == {"b"}
    assert batcher.drop_cancelled({"b"}) == 3
    dropped = await second
    assert all(isinstance(o.error, StreamCancelled) for o in dropped)
    assert [o.value for o in await first] == ["a1", "a2"]
    await batcher.aclose()
    assert sent == [["a1", "a2"]]  # b's items never reached the backend


async def test_a_cancelled_job_waiting_in_the_batcher_never_reaches_triton(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    triton.set_exec_ms(EXEC_MS)
    await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s
    try:
        start_worker()
        before = inferences(triton)
        ahead = await client.submit("embed", embed(AHEAD, "ahead"))
        # The worker runs packages side by side: the second job is sent only once the first
        # one's inputs are in the batcher (its first batch has run), so they are queued ahead.
        deadline = time.monotonic() + 30
        while inferences(triton) == before:
            assert time.monotonic() < deadline, "the first job never reached Triton"
            await asyncio.sleep(0.02)
        behind = await client.submit("embed", embed(64, "behind"))
        while (await client.get(behind)).status != Status.running:
            assert time.monotonic() < deadline, "the second job never started"
            await asyncio.sleep(0.02)
        cancelled = await client.cancel(behind, settle_s=5)
        finished = await client.wait(ahead, 60)
    finally:
        triton.set_exec_ms(5)
    assert cancelled.status == Status.cancelled
    assert cancelled.error is not None and cancelled.error.type == "cancelled"
    assert finished.status == Status.succeeded and len(finished.body["data"]) == AHEAD  # type: ignore[index]
    await asyncio.sleep(0.5)  # Triton's metrics are sampled
    assert inferences(triton) - before == AHEAD  # the cancelled job's 64 inputs were never sent
