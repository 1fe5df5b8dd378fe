"""Replies: one Redis list per client that receives its own jobs' terminal envelopes.

Waiting on each job separately costs a client three commands per job (read, block, read
again) and a blocked connection per waiter. Instead, a job submitted with ``submit()`` names
this client's reply list in its record; the worker's finish script (and a cancel) pushes
``"<job id> <envelope JSON>"`` there in the same atomic step as the result write. One reader
task drains the list with ``BLMPOP ... COUNT`` and hands each envelope to its waiter, so many
results cost one round trip.

The list is a shortcut, never the source of truth: the record holds the same envelope, a
waiter re-checks it every ``RECHECK_S``, and a reply that was trimmed or dropped only costs
latency. Replies for jobs nobody waits on yet are kept (bounded) for a later ``wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from typing import Any

from ..contract import Keys

# A waiter re-reads the record after this, then at doubling intervals up to the maximum.
RECHECK_S = 1.0
MAX_RECHECK_S = 8.0
# Replies popped per round trip, and the reader's block time (its idle cost: 1 command per s).
POP_COUNT = 1024
BLOCK_S = 1
# Jobs this client may still get a reply for; replies kept for jobs not yet waited on (a
# producer that submits and never waits must not grow without bound).
MAX_TRACKED = 100_000
MAX_EARLY = 10_000
EARLY_TTL_S = 60.0


class Replies:
    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis = redis
        self.key = keys.reply(secrets.token_hex(8))
        self._expected: OrderedDict[str, str] = OrderedDict()  # job id → its tenant
        self._early: OrderedDict[str, tuple[float, str, str]] = OrderedDict()  # (at, envelope, tenant)
        self._waiters: dict[str, asyncio.Future[str | None]] = {}
        self._feeds: dict[str, asyncio.Queue[tuple[str, str]]] = {}  # job id → its reader's feed
        self._reader: asyncio.Task[None] | None = None

    def expect(self, jobs: list[tuple[str, str]]) -> None:
        """Note jobs (id, tenant) whose records name this reply list (call once they are written)."""
        for job_id, tenant in jobs:
            self._expected[job_id] = tenant
        while len(self._expected) > MAX_TRACKED:
            self._expected.popitem(last=False)  # the oldest fall back to the record
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name=f"replies:{self.key}")

    def expects(self, job_id: str, tenant: str | None = None) -> bool:
        """Is the job's reply coming here, for ``tenant`` (any tenant if None)?

        A waiter of another tenant is not the job's: it must not take the reply meant for the
        job's owner (and learns at once from the record that there is no such job for it).
        """
        owner = self._expected.get(job_id)
        if owner is None and job_id in self._early:
            owner = self._early[job_id][2]
        return owner is not None and (tenant is None or owner == tenant)

    def take_ready(self, job_id: str) -> str | None:
        """The envelope JSON if it already arrived."""
        early = self._early.pop(job_id, None)
        if early is None:
            return None
        self._expected.pop(job_id, None)
        return early[1]

    def forget(self, job_id: str) -> None:
        """The caller stopped waiting (it read the record, or gave up)."""
        self._expected.pop(job_id, None)
        self._early.pop(job_id, None)
        future = self._waiters.pop(job_id, None)
        if future is not None and not future.done():
            future.cancel()

    def subscribe(self, job_ids: list[str]) -> asyncio.Queue[tuple[str, str]]:
        """A feed of (job id, envelope JSON) for ``job_ids`` (all expected here), the replies
        already in first: a reader of many jobs takes what finished, not a look at each job."""
        feed: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        for job_id in job_ids:
            raw = self.take_ready(job_id)
            if raw is not None:
                feed.put_nowait((job_id, raw))
            else:
                self._feeds[job_id] = feed
        return feed

    def unsubscribe(self, job_ids: list[str], *, done: bool) -> None:
        """Stop feeding ``job_ids``: those ``done`` are forgotten; others stay expected, so
        their replies are kept for a later read."""
        for job_id in job_ids:
            self._feeds.pop(job_id, None)
            if done:
                self._expected.pop(job_id, None)

    async def take(self, job_id: str, timeout: float) -> str | None:
        """Wait up to ``timeout`` for the job's envelope JSON; None if it has not come."""
        raw = self.take_ready(job_id)
        if raw is not None or timeout <= 0:
            return raw
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str | None] = loop.create_future()
        self._waiters[job_id] = future
        # A timer, not wait_for: no extra task or shield per waiter.
        timer = loop.call_later(timeout, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            if self._waiters.get(job_id) is future:
                del self._waiters[job_id]

    async def _read(self) -> None:
        while True:
            try:
                popped = await self.redis.execute_command(
                    "BLMPOP", BLOCK_S, 1, self.key, "LEFT", "COUNT", POP_COUNT
                )
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis restarting: waiters fall back to their records meanwhile
                await asyncio.sleep(0.2)
                continue
            if popped:
                for raw in popped[1]:
                    self._deliver(raw)

    def _deliver(self, raw: str) -> None:
        job_id, _, envelope = raw.partition(" ")
        feed = self._feeds.pop(job_id, None)
        if feed is not None:
            self._expected.pop(job_id, None)
            feed.put_nowait((job_id, envelope))
            return
        future = self._waiters.pop(job_id, None)
        if future is not None and not future.done():
            self._expected.pop(job_id, None)
            future.set_result(envelope)
        elif job_id in self._expected:
            now = time.monotonic()
            self._early[job_id] = (now, envelope, self._expected[job_id])
            while self._early:
                oldest, (at, _, _) = next(iter(self._early.items()))
                if len(self._early) <= MAX_EARLY and now - at < EARLY_TTL_S:
                    break
                del self._early[oldest]
                self._expected.pop(oldest, None)

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        for future in self._waiters.values():
            future.cancel()
        self._waiters.clear()


def _expire(future: asyncio.Future[str | None]) -> None:
    if not future.done():
        future.set_result(None)
