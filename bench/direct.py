"""Direct Triton baselines, no queue: full client-side batches, and one call per item.

These are the limits overspill is compared with: the same Triton, the same model, fed as
well as a client can feed it (64 items per gRPC request at the best concurrency), or as a
plain gateway does (one synchronous request per call).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import tritonclient.grpc as grpc_sync
import tritonclient.grpc.aio as grpc_aio

from .load import Call, texts, timed_phase
from .stats import Run

OUTPUTS = ("EMBEDDING", "TOKENS", "ERROR")
BATCH = 64  # the models' max_batch_size


def _tensor(module: object, batch: list[str]) -> object:
    array = np.array([t.encode() for t in batch], dtype=np.object_).reshape(-1, 1)
    tensor = module.InferInput("TEXT", list(array.shape), "BYTES")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(array)
    return tensor


async def _infer(client: grpc_aio.InferenceServerClient, model: str, batch: list[str]) -> None:
    outputs = [grpc_aio.InferRequestedOutput(n) for n in OUTPUTS]
    result = await client.infer(model, [_tensor(grpc_aio, batch)], outputs=outputs, client_timeout=60)
    result.as_numpy("EMBEDDING")


async def batched(url: str, model: str, n: int, concurrency: int, *, timeout_s: float) -> Run:
    """``n`` items in requests of 64, ``concurrency`` requests in flight."""
    items = texts(n)
    batches = iter([items[i : i + BATCH] for i in range(0, n, BATCH)])
    client = grpc_aio.InferenceServerClient(url)

    async def lane() -> None:
        for batch in batches:
            await _infer(client, model, batch)

    try:
        await _infer(client, model, items[:BATCH])  # connect before the clock starts
        with timed_phase():
            start = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*(lane() for _ in range(concurrency))), timeout_s)
            seconds = time.perf_counter() - start
        return Run(n, seconds)
    finally:
        await client.close()


async def best_batched(
    url: str, model: str, n: int, *, concurrencies: tuple[int, ...] = (1, 2, 4), timeout_s: float
) -> tuple[int, dict[int, float]]:
    """Probe each concurrency once; the best one and every probe's items/s."""
    rates = {c: (await batched(url, model, n, c, timeout_s=timeout_s)).rate for c in concurrencies}
    best = max(rates, key=lambda c: rates[c])
    return best, {c: round(r, 1) for c, r in rates.items()}


def naive(url: str, model: str, seconds: float, *, max_calls: int = 100_000) -> Run:
    """One synchronous single-item request per call, back to back, for ``seconds``."""
    client = grpc_sync.InferenceServerClient(url)
    outputs = [grpc_sync.InferRequestedOutput(n) for n in OUTPUTS]
    items = texts(max_calls)
    latencies: list[float] = []
    try:
        client.infer(model, [_tensor(grpc_sync, items[:1])], outputs=outputs)
        start = time.perf_counter()
        for text in items:
            t0 = time.perf_counter()
            client.infer(model, [_tensor(grpc_sync, [text])], outputs=outputs, client_timeout=60)
            latencies.append((time.perf_counter() - t0) * 1000)
            if t0 - start >= seconds:
                break
        return Run(len(latencies), time.perf_counter() - start, latencies)
    finally:
        client.close()


class SingleCalls:
    """Open-loop direct calls: one single-item async request per arrival (Triton batches them)."""

    def __init__(self, url: str, model: str, n: int) -> None:
        self.client = grpc_aio.InferenceServerClient(url)
        self.model = model
        self.items = texts(n)

    def call(self) -> Call:
        async def call(i: int) -> None:
            await _infer(self.client, self.model, [self.items[i % len(self.items)]])

        return call

    async def __aenter__(self) -> SingleCalls:
        await _infer(self.client, self.model, self.items[:1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
