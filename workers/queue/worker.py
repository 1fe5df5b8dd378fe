"""arq's Worker, changed in two places for a queue of many small work packages.

arq starts jobs one by one: a poll reads due ids, then each job costs four sequential round
trips (WATCH, EXISTS, ZSCORE, MULTI/EXEC) before it runs, and between polls the worker
sleeps ``poll_delay``. At hundreds of packages a second that is most of the worker's Redis
traffic and a fixed share of every job's latency. :class:`PackageWorker` keeps arq's job
format, in-progress keys, retries, timeouts and result handling, and changes only:

- **claiming**: one script reads the due ids and claims up to the free slots (sets their
  in-progress keys, as arq's transaction does) in a single round trip per poll;
- **fair share**: a lane's claim (``fair_claim.lua``) serves tenants in turn, weighted by their
  shares (docs/scheduling.md), and learns from the same call which packages this worker
  finished since its last, so no package costs an extra round trip;
- **waking**: producers ``PUBLISH`` on the queue's wake channel (``wake_channel``) when they
  queue a package, so the worker polls at once instead of at its next tick, and a worker
  whose every slot was taken polls as soon as one frees; ``poll_delay`` stays as the fallback
  that finds deferred jobs and covers a lost message.

The claim script touches keys it derives from the ids (as arq's own code does), so like arq
it needs a single Redis, not a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import time
from typing import Any

from arq.constants import in_progress_key_prefix
from arq.utils import timestamp_ms
from arq.worker import Worker, func
from redis.exceptions import RedisError

from producer.contract import LUA_FAIR_CLAIM, create_arq_pool, get_logger, wake_channel

from .admission import Admission

log = get_logger(__name__)

# KEYS: the queue. ARGV: now (ms), slots, ids to scan at most, in-progress ttl (ms), its key prefix.
# Returns id, score, id, score, ... of the packages it claimed (oldest first).
LUA_CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
local slots = tonumber(ARGV[2])
local out = {}
for i = 1, #due, 2 do
  if #out >= 2 * slots then break end
  local key = ARGV[5] .. due[i]
  if redis.call('EXISTS', key) == 0 then
    redis.call('PSETEX', key, ARGV[4], '1')
    out[#out + 1] = due[i]
    out[#out + 1] = due[i + 1]
  end
end
return out
"""

# Seconds between reconnection attempts of the wake listener (polling goes on meanwhile).
RESUBSCRIBE_S = 1.0


async def listen_for_wakeups(redis: Any, channel: str, wake: asyncio.Event) -> None:
    """Set ``wake`` on every message of ``channel``, and whenever the subscription (re)starts or
    is lost (what was published meanwhile is found by the next poll); resubscribe on errors."""
    while True:
        try:
            async with redis.pubsub() as pubsub:
                await pubsub.subscribe(channel)
                wake.set()  # anything queued while unsubscribed is found now
                async for message in pubsub.listen():
                    if message["type"] == "message":
                        wake.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis restarting: the poll_delay fallback covers the gap
            log.warning("wake channel lost; polling until it is back", channel=channel, error=str(exc)[:200])
            wake.set()  # the loop's own retry finds out when Redis is back
            await asyncio.sleep(RESUBSCRIBE_S)


class Backoff:
    """Waits between attempts to reach Redis: doubling from ``first_s`` to ``max_s``.

    Logs once when an outage starts and once when it ends, not once per attempt.
    """

    def __init__(self, first_s: float = 0.1, max_s: float = 2.0) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.wait_s = 0.0
        self.since: float | None = None

    async def failed(self, what: str, exc: BaseException) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("redis unreachable; retrying", loop=what, error=repr(exc)[:200])
        self.wait_s = min(self.max_s, max(self.first_s, self.wait_s * 2))
        await asyncio.sleep(self.wait_s)

    def recovered(self, what: str) -> None:
        if self.since is not None:
            log.info("redis reachable again", loop=what, outage_s=round(time.monotonic() - self.since, 2))
            self.since = None
            self.wait_s = 0.0


class _Functions(dict[str, Any]):
    """arq's function table, answering an unknown name with a fallback instead of a KeyError
    (on which arq would drop the package and leave its jobs open)."""

    def __init__(self, functions: dict[str, Any], fallback: Any) -> None:
        super().__init__(functions)
        self.fallback = fallback

    def __missing__(self, name: str) -> Any:
        return self.fallback


class PackageWorker(Worker):
    """An arq Worker that claims due packages in one script and wakes when one is queued.

    ``unknown_task``: the arq function that runs a package whose task name is unknown.
    ``admission``: bounds the work held (see :mod:`workers.queue.admission`); else ``max_jobs``.
    ``lease_s``: a claimed package's in-progress key lives this long and is renewed every
    third of it while this worker runs the package (a heartbeat), so a killed worker's packages
    run again elsewhere after at most ``lease_s``, not after arq's whole time limit.
    ``fair``: the lane's fair-share key prefix and the shares hash (``Keys.fair``,
    ``Keys.shares``); without it, due packages are claimed oldest first (webhook deliveries).
    """

    def __init__(
        self,
        *args: Any,
        unknown_task: Any = None,
        admission: Admission | None = None,
        lease_s: float | None = None,
        fair: tuple[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.admission = admission
        self.fair = fair
        self._finished: list[str] = []  # packages ended since the last fair claim told Redis
        self.lease_s = lease_s
        self._heartbeat: asyncio.Task[None] | None = None
        self._held_back = False  # the last poll claimed less than it had slots for
        self.last_claim_at: float | None = None  # epoch of the last poll that claimed a package
        if unknown_task is not None:
            self.functions = _Functions(self.functions, func(unknown_task, name="unknown_task", max_tries=1))
        self._wake = asyncio.Event()
        self._claim: Any = None
        self._listener: asyncio.Task[None] | None = None
        self.channel = wake_channel(self.queue_name)

    async def main(self) -> None:
        """arq's main loop, with the fixed sleep replaced by "until woken, or ``poll_delay``"."""
        if self._pool is None:
            self._pool = await create_arq_pool(  # arq's, or a Sentinel pool with its credentials
                self.redis_settings,
                job_deserializer=self.job_deserializer,
                job_serializer=self.job_serializer,
                default_queue_name=self.queue_name,
                expires_extra_ms=self.expires_extra_ms,
            )
        self.ctx["redis"] = self.pool
        self._claim = self.pool.register_script(LUA_FAIR_CLAIM if self.fair else LUA_CLAIM)
        self._listener = asyncio.create_task(self._listen(), name=f"wake:{self.queue_name}")
        if self.lease_s:
            self._heartbeat = asyncio.create_task(self._renew_leases(), name=f"lease:{self.queue_name}")
        if self.on_startup:
            await self.on_startup(self.ctx)
        outage = Backoff()
        try:
            while True:
                self._wake.clear()
                try:
                    await self._poll_iteration()
                except (RedisError, OSError) as exc:
                    # Redis restarting: keep the loop and every running package; poll again.
                    await outage.failed(f"queue {self.queue_name}", exc)
                    continue
                outage.recovered(f"queue {self.queue_name}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_delay_s)
        finally:
            for task in (self._listener, self._heartbeat):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    async def close(self) -> None:
        """arq's close, but a dead connection or a crashed runner cannot make shutdown fail."""
        if not self._handle_signals:
            self.handle_sig(signal.SIGUSR1)
        if not self._pool:
            return
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        with contextlib.suppress(RedisError, OSError):
            await self.pool.delete(self.health_check_key)
        if self._finished:  # the lanes' in-flight counts need not wait for the lease check
            with contextlib.suppress(RedisError, OSError):
                await self._claim_due(0)
        if self.on_shutdown:
            await self.on_shutdown(self.ctx)
        with contextlib.suppress(RedisError, OSError):
            await self.pool.close(close_connection_pool=True)
        self._pool = None

    async def release_unfinished(self) -> int:
        """Cancel the packages still running: arq puts each back in its queue and deletes its
        in-progress key (``retry_jobs``), so another worker takes it at once rather than after
        the lease. Results already written stay written; the job records skip finished items."""
        running = [t for t in self.job_tasks.values() if not t.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        return len(running)

    async def _poll_iteration(self) -> None:
        if self.allow_pick_jobs and self.job_counter < self.max_jobs:
            slots = self.max_jobs - self.job_counter
            if self.admission is not None:
                admitted = self.admission.packages(slots)
                self._held_back = admitted < slots
                slots = admitted
            if slots > 0 or self._finished:
                await self._claim_due(slots)
        if self.allow_abort_jobs:
            await self._cancel_aborted_jobs()
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                if not task.cancelled() and task.exception() is not None:
                    # arq's own job runner crashed (its Redis calls, e.g. while Redis restarts).
                    # The package keeps its queue entry and in-progress key, so it runs again
                    # once that key expires; the job records decide what is already done.
                    log.warning("package runner failed", package=job_id, error=repr(task.exception())[:200])
        await self.heart_beat()

    async def _renew_leases(self) -> None:
        """Every third of the lease, extend the in-progress keys of the packages still running."""
        assert self.lease_s is not None
        ttl_ms = int(self.lease_s * 1000)
        while True:
            await asyncio.sleep(self.lease_s / 3)
            running = [job_id for job_id, task in self.tasks.items() if not task.done()]
            if not running:
                continue
            try:
                async with self.pool.pipeline(transaction=False) as pipe:
                    for job_id in running:
                        pipe.pexpire(in_progress_key_prefix + job_id, ttl_ms)  # a no-op once deleted
                    await pipe.execute()
            except (RedisError, OSError) as exc:  # Redis restarting: the next beat tries again
                log.warning("lease renewal failed", packages=len(running), error=repr(exc)[:200])

    async def _claim_due(self, slots: int) -> None:
        in_progress_s = self.lease_s or self.in_progress_timeout_s
        in_progress_ms = int(in_progress_s * 1000)
        if self.fair is None:
            args = [timestamp_ms(), slots, self.queue_read_limit, in_progress_ms, in_progress_key_prefix]
            claimed = await self._claim(keys=[self.queue_name], args=args)
        else:
            finished, self._finished = self._finished, []
            args = [timestamp_ms(), slots, in_progress_ms, in_progress_key_prefix, *self.fair, *finished]
            try:
                claimed = await self._claim(keys=[self.queue_name], args=args)
            except BaseException:
                self._finished[:0] = finished  # told with the next call (or found by the lease check)
                raise
        if claimed:
            self.last_claim_at = time.time()  # for the status report (workers/app/status.py)
        for i in range(0, len(claimed), 2):
            job_id = claimed[i].decode() if isinstance(claimed[i], bytes) else claimed[i]
            await self.sem.acquire()  # never waits: the script claimed at most the free slots
            self.job_counter += 1
            if self.admission is not None:
                self.admission.claimed(job_id)
            task = self.loop.create_task(self.run_job(job_id, int(float(claimed[i + 1]))))
            task.add_done_callback(functools.partial(self._job_done, job_id))
            self.tasks[job_id] = task

    def _job_done(self, job_id: str, _: asyncio.Task[None]) -> None:
        if self.fair is not None:
            self._finished.append(job_id)
        full = self.job_counter >= self.max_jobs
        if self.admission is not None:
            self.admission.forget(job_id)  # whatever its run did not report (dropped, crashed)
            full = full or self._held_back  # room may have opened under the admission limit
        self._release_sem_dec_counter_on_complete()
        if full or self.fair is not None:  # queued packages wait for this slot; the claim settles it
            self._wake.set()

    async def _listen(self) -> None:
        await listen_for_wakeups(self.pool, self.channel, self._wake)
