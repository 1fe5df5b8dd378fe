"""The worker's delivery loop: webhooks leave at the rate receivers take them, fair between tenants.

Deliveries wait in the outbox (``producer/contract/deliveries.py``), a line per tenant. The loop
claims due ones in one script call, up to ``CLAIM_BATCH`` at a time and ``backlog`` of one tenant,
skipping the tenants whose backlog here is full, so one tenant's thousands never stand in front
of another tenant's one. Each tenant has at most ``webhook_tenant_max_inflight`` POSTs in flight
and the worker ``webhook_max_jobs``; a slow receiver holds only its own tenant's slots, and a
delivery over its tenant's cap waits here, in order, rather than being put off and queued again.

What became of each POST is written in batches: one pipeline for every delivery that finished
since the last one. A claimed delivery stays in its line with a lease, renewed while this worker
holds it; a worker killed mid-delivery leaves it to be claimed again when the lease ends (at
least once, same ``webhook-id``). A worker that stops hands back what it has not started.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque

from redis.exceptions import RedisError

from producer.contract import LUA_OUTBOX_CLAIM, Delivery, ErrorInfo, get_logger
from producer.contract.wire import wake_channel

from ..core.metrics import WEBHOOK_DELIVERIES, WEBHOOK_HELD
from ..queue.worker import Backoff, listen_for_wakeups
from .webhooks import Attempt, Webhooks

log = get_logger("workers.delivery.outbox")

CLAIM_BATCH = 256  # deliveries claimed by one script call at most
BACKLOG_PER_SLOT = 4  # a tenant's backlog here: this many deliveries per slot it may hold


class Outbox:
    """Claims, sends and settles webhook deliveries for one worker process."""

    def __init__(self, webhooks: Webhooks) -> None:
        s = webhooks.settings
        self.webhooks = webhooks
        self.redis = webhooks.redis
        self.box = webhooks.keys.outbox()
        self.cap = s.webhook_tenant_max_inflight
        self.slots = s.webhook_max_jobs
        self.backlog = BACKLOG_PER_SLOT * self.cap
        self.held_max = BACKLOG_PER_SLOT * self.slots
        self.poll_s = s.webhook_poll_delay_s
        self.lease_s = s.webhook_lease_s
        self._claim = self.redis.register_script(LUA_OUTBOX_CLAIM)
        self.waiting: dict[str, deque[tuple[Delivery, str | None]]] = {}
        self.inflight: Counter[str] = Counter()
        self.held: dict[str, Delivery] = {}  # webhook_id → claimed and not settled yet
        self.finished: list[tuple[Delivery, Attempt | None]] = []
        self.sending: set[asyncio.Task[None]] = set()
        self.wake = asyncio.Event()
        self.claiming = True

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Claim, send and settle until cancelled; an unreachable Redis is waited out."""
        listener = listen_for_wakeups(self.redis, wake_channel(self.box), self.wake)
        helpers = [asyncio.create_task(listener), asyncio.create_task(self._renew())]
        outage = Backoff()
        try:
            while True:
                self.wake.clear()
                try:
                    await self._settle()
                    if self.claiming:
                        await self._claim_due()
                except (RedisError, OSError) as exc:
                    await outage.failed("webhook outbox", exc)
                    continue
                outage.recovered("webhook outbox")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self.poll_s)
        finally:
            for task in helpers:
                task.cancel()

    async def aclose(self, grace_s: float) -> None:
        """Stop claiming, let the POSTs in flight finish for ``grace_s``, write what they came to,
        and hand back the rest (due at once, for another worker: at least once, same webhook-id)."""
        self.claiming = False
        if self.sending:
            await asyncio.wait(self.sending, timeout=grace_s)
        for task in self.sending:
            task.cancel()
        with contextlib.suppress(RedisError, OSError):
            await self._settle()
            await self._hand_back()

    # ------------------------------------------------------------------ claim and send

    async def _claim_due(self) -> None:
        room = self.held_max - len(self.held)
        if room <= 0:
            return
        full = [t for t, q in self.waiting.items() if len(q) + self.inflight[t] >= self.backlog]
        now_ms = int(time.time() * 1000)
        args = [self.box, now_ms, int(self.lease_s * 1000), min(room, CLAIM_BATCH), self.backlog, *full]
        claimed = await self._claim(args=args)
        if not claimed:
            return
        deliveries = []
        for i in range(0, len(claimed), 2):
            try:
                deliveries.append(Delivery.model_validate_json(claimed[i + 1]))
            except ValueError as exc:  # not ours to send: taken out, never retried
                log.error(
                    "malformed webhook delivery dropped", webhook_id=str(claimed[i]), error=str(exc)[:200]
                )
                await self.redis.hdel(self.box + "data", claimed[i])
        checks = await self.webhooks.checks(deliveries)
        for d, check in zip(deliveries, checks, strict=True):
            if d.webhook_id in self.held:  # claimed again after its lease: still ours
                continue
            self.held[d.webhook_id] = d
            if check == "duplicate":
                self.finished.append((d, None))
            else:
                self.waiting.setdefault(d.tenant, deque()).append((d, check))
        self._start_sends()

    def _start_sends(self) -> None:
        """Start POSTs while slots are free: a tenant at a time, each below its cap."""
        self._fill_slots()
        WEBHOOK_HELD.labels("waiting").set(sum(map(len, self.waiting.values())))
        WEBHOOK_HELD.labels("sending").set(sum(self.inflight.values()))

    def _fill_slots(self) -> None:
        while len(self.sending) < self.slots:
            started = False
            for tenant in list(self.waiting):
                queue = self.waiting[tenant]
                if self.inflight[tenant] < self.cap and len(self.sending) < self.slots:
                    d, disabled = queue.popleft()
                    del self.waiting[tenant]
                    if queue:  # to the back: the next free slot goes to the next tenant
                        self.waiting[tenant] = queue
                    self.inflight[tenant] += 1
                    task = asyncio.create_task(self._send(d, disabled))
                    self.sending.add(task)
                    task.add_done_callback(self.sending.discard)
                    started = True
            if not started:
                return

    async def _send(self, d: Delivery, disabled: str | None) -> None:
        try:
            attempt = await self.webhooks.attempt(d, disabled)
        except Exception as exc:  # a bug must not lose the delivery: retried on the schedule
            log.exception("webhook attempt crashed", webhook_id=d.webhook_id, job_id=d.job_id)
            error = ErrorInfo(type="network_error", message=f"attempt failed: {type(exc).__name__}")
            attempt = Attempt(error=error, retryable=True)
        finally:
            self.inflight[d.tenant] -= 1
            if self.inflight[d.tenant] <= 0:
                del self.inflight[d.tenant]
        self.finished.append((d, attempt))
        self._start_sends()
        self.wake.set()

    # ------------------------------------------------------------------ settle and leases

    async def _settle(self) -> None:
        """Write what every finished delivery came to, all in one pipeline."""
        if not self.finished:
            return
        batch, self.finished = self.finished, []
        outcomes = []
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for d, attempt in batch:
                    outcomes.append(await self.webhooks.settle(pipe, d, attempt))
                await pipe.execute()
        except BaseException:
            self.finished[:0] = batch  # written on the next try (each write is idempotent)
            raise
        for (d, _), outcome in zip(batch, outcomes, strict=True):
            self.held.pop(d.webhook_id, None)
            WEBHOOK_DELIVERIES.labels(outcome).inc()

    async def _renew(self) -> None:
        """Every third of the lease, extend the leases of the deliveries this worker holds."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if self.held:
                with contextlib.suppress(RedisError, OSError):
                    await self._rescore(list(self.held.values()), time.time() + self.lease_s)

    async def _hand_back(self) -> None:
        """Deliveries claimed and not settled (not started, or cut off): due at once, for another worker."""
        unsent = list(self.held.values())
        self.waiting.clear()
        self.held.clear()
        if unsent:
            await self._rescore(unsent, time.time())
            log.info("webhook deliveries handed back", deliveries=len(unsent))

    async def _rescore(self, deliveries: list[Delivery], at: float) -> None:
        at_ms = int(at * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            for d in deliveries:
                pipe.zadd(self.box + "t:" + d.tenant, {d.webhook_id: at_ms}, xx=True)
                pipe.zadd(self.box + "tenants", {d.tenant: at_ms}, lt=True)
            await pipe.execute()
