"""Load through the published API port, and the count of what became of every accepted job."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


@dataclass
class Load:
    """Jobs submitted one by one over HTTP (``POST /v1/jobs``), as a producer would."""

    api: str
    api_key: str
    accepted: list[str] = field(default_factory=list)
    refused: Counter[int] = field(default_factory=Counter)  # status code → count (e.g. 503 mid-restart)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    async def submit(self, n: int, *, concurrency: int = 8, per_s: float = 100.0) -> None:
        """Submit ``n`` single-text embedding jobs at about ``per_s``, bounded in count and rate."""
        gate = asyncio.Semaphore(concurrency)
        start = time.monotonic()

        async def one(http: httpx.AsyncClient, i: int) -> None:
            await asyncio.sleep(max(0.0, start + i / per_s - time.monotonic()))
            body = {"kind": "embed", "body": {"model": "all-MiniLM-L6-v2", "input": f"compose load {i}"}}
            async with gate:
                try:
                    response = await http.post("/v1/jobs", json=body)
                except httpx.HTTPError:
                    self.refused[0] += 1
                    return
            if response.status_code == 202:
                self.accepted.append(response.json()["id"])
            else:
                self.refused[response.status_code] += 1

        async with httpx.AsyncClient(base_url=self.api, headers=self.headers, timeout=30) as http:
            await asyncio.gather(*(one(http, i) for i in range(n)))

    async def outcomes(self, *, deadline_s: float = 180.0) -> Counter[str]:
        """Each accepted job's final status (long-polled); ``lost`` for one that never ends."""
        end = time.monotonic() + deadline_s
        gate = asyncio.Semaphore(16)

        async def final(http: httpx.AsyncClient, job_id: str) -> str:
            async with gate:
                while time.monotonic() < end:
                    try:
                        response = await http.get(f"/v1/jobs/{job_id}", params={"wait": 20})
                    except httpx.HTTPError:
                        await asyncio.sleep(1)  # the API or Redis is coming back
                        continue
                    if response.status_code == 404:
                        return "lost"
                    if response.status_code == 200 and response.json()["status"] in TERMINAL:
                        return str(response.json()["status"])
                    await asyncio.sleep(0.5 if response.status_code != 200 else 0)
                return "lost"

        async with httpx.AsyncClient(base_url=self.api, headers=self.headers, timeout=40) as http:
            return Counter(await asyncio.gather(*(final(http, j) for j in self.accepted)))
