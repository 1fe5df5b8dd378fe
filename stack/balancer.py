"""A client-side load balancer over several API processes, for rolling restarts under load.

It does what a load balancer in front of the API does: health-checks each process's
``/readyz`` and sends new requests, round robin, only to those that answer 200 (to every one
when none does, as a balancer fails open); a request that meets a connection error or a 503
moves to the next process. Submissions carry an ``Idempotency-Key``, so a retry after an
answer that was lost returns the job already queued instead of queueing a second: every
logical submission is exactly one job, which is what lets a test count every job.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class BalancerStats:
    accepted: int = 0
    moved: int = 0  # attempts that met a closed port, a dropped connection or a 503
    throttled: int = 0  # 429s, retried after their Retry-After
    failed: int = 0  # submissions refused (4xx/5xx) or not accepted within the retry time


class Balancer:
    def __init__(
        self,
        urls: list[str],
        *,
        headers: dict[str, str] | None = None,
        retry_s: float = 20.0,
        check_every_s: float = 0.25,
    ) -> None:
        self.urls = list(urls)
        self.retry_s = retry_s
        self.stats = BalancerStats()
        self._check_every_s = check_every_s
        timeout = httpx.Timeout(10.0, connect=1.0)
        self._http = [httpx.AsyncClient(base_url=u, headers=headers, timeout=timeout) for u in urls]
        self._ready = set(range(len(urls)))
        self._turn = itertools.count()
        self._checker: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Balancer:
        self._checker = asyncio.create_task(self._check_forever(), name="balancer-health")
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._checker is not None:
            self._checker.cancel()
            await asyncio.gather(self._checker, return_exceptions=True)
        await asyncio.gather(*(h.aclose() for h in self._http))

    async def submit(self, kind: str, body: dict[str, Any], key: str) -> str | None:
        """The job's id, or None when it was refused or no process accepted it in ``retry_s``."""
        deadline = time.monotonic() + self.retry_s
        job = {"kind": kind, "body": body}
        while time.monotonic() < deadline:
            i = self._pick()
            try:
                r = await self._http[i].post("/v1/jobs", json=job, headers={"Idempotency-Key": key})
            except httpx.TransportError:
                self._ready.discard(i)  # until its next health check says otherwise
                self.stats.moved += 1
                await asyncio.sleep(0.02)
                continue
            if r.status_code == 503:
                self.stats.moved += 1
                await asyncio.sleep(0.02)
                continue
            if r.status_code == 429:
                self.stats.throttled += 1
                await asyncio.sleep(min(float(r.headers.get("retry-after") or 0.1), 1.0))
                continue
            if r.status_code != 202:
                break
            self.stats.accepted += 1
            return str(r.json()["id"])
        self.stats.failed += 1
        return None

    def _pick(self) -> int:
        ready = sorted(self._ready) or list(range(len(self.urls)))
        return ready[next(self._turn) % len(ready)]

    async def _check_forever(self) -> None:
        while True:
            answers = await asyncio.gather(*(self._ready_now(h) for h in self._http))
            self._ready = {i for i, ok in enumerate(answers) if ok}
            await asyncio.sleep(self._check_every_s)

    @staticmethod
    async def _ready_now(http: httpx.AsyncClient) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return (await http.get("/readyz", timeout=1.0)).status_code == 200
        return False
