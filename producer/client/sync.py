"""SyncClient: the client library for code without an event loop (scripts, notebooks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from ..contract import JobKind, JobResult, StreamEvent
from .client import Client, Request


class SyncClient:
    """Blocking wrapper around :class:`Client` for scripts and notebooks."""

    def __init__(self, redis_url: str = "redis://127.0.0.1:6379/0", **kwargs: Any) -> None:
        self._runner = asyncio.Runner()
        self._client: Client = self._runner.run(_make_client(redis_url, kwargs))

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._runner.run(self._client.aclose())
        self._runner.close()

    def submit(self, kind: JobKind | str, body: dict[str, Any], **options: Any) -> str:
        return self._runner.run(self._client.submit(kind, body, **options))

    def submit_many(self, requests: Iterable[Request], **options: Any) -> list[str]:
        return self._runner.run(self._client.submit_many(requests, **options))

    def get(self, job_id: str, **kw: Any) -> JobResult:
        return self._runner.run(self._client.get(job_id, **kw))

    def wait(self, job_id: str, timeout: float = 60.0, **kw: Any) -> JobResult:
        return self._runner.run(self._client.wait(job_id, timeout, **kw))

    def wait_many(self, job_ids: Sequence[str], timeout: float = 300.0, **kw: Any) -> list[JobResult]:
        return self._runner.run(self._client.wait_many(job_ids, timeout, **kw))

    def cancel(self, job_id: str, **kw: Any) -> JobResult:
        return self._runner.run(self._client.cancel(job_id, **kw))

    def stream(self, job_id: str, **kw: Any) -> Iterator[StreamEvent]:
        """:meth:`Client.stream` as a blocking iterator: the job's events as they happen."""
        events = self._client.stream(job_id, **kw)
        try:
            while True:
                try:
                    yield self._runner.run(_next(events))
                except StopAsyncIteration:
                    return
        finally:
            self._runner.run(events.aclose())  # type: ignore[attr-defined]


async def _next(events: AsyncIterator[StreamEvent]) -> StreamEvent:
    return await events.__anext__()


async def _make_client(redis_url: str, kwargs: dict[str, Any]) -> Client:
    # The Redis pool must be created inside the runner's loop.
    return Client(redis_url, **kwargs)
