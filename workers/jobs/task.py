"""The arq task: run one work package (many jobs) and write each job's result.

Steps, each a small function below:
0. a bulk chunk of texts runs as a block (:mod:`workers.blocks`); other packages go on:
1. decode the package; a malformed item fails alone;
2. a re-run (the worker died or timed out) is split in two and re-queued, so a crashing
   item ends up alone and its batch-mates finish;
3. mark items running (already-terminal ones, e.g. cancelled, are skipped);
4. expire items past their deadline, run the rest concurrently (they meet in the batchers),
   within a time limit counted from when the package's work starts (:mod:`workers.core.progress`);
5. write results as each batch comes back (:mod:`workers.jobs.writer`), so a time-out or a kill
   loses only what had not; re-queue, with backoff, items whose backend was unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog
from arq.worker import RetryJob
from redis.exceptions import RedisError

from producer.contract import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_PACK_SIZE,
    ErrorInfo,
    ErrorType,
    JobResult,
    Keys,
    Lane,
    Route,
    Status,
    WorkItem,
    get_logger,
)

from ..backends.local.handlers import LocalHandlers
from ..backends.local.triton import TritonBackend
from ..blocks.runner import BlockRunner
from ..core.cancels import CancelWatch
from ..core.errors import (
    BackendUnavailable,
    DeadlineShed,
    InferenceFailed,
    ItemError,
    StreamCancelled,
    StreamInterrupted,
)
from ..core.metrics import PACKAGES
from ..core.progress import PackageClock, within
from ..core.settings import WorkerConfig
from ..delivery.settings import WebhookSettings
from ..delivery.webhooks import Webhooks
from ..dispatch.dispatcher import Dispatched, Dispatcher
from ..dispatch.settings import DispatchSettings
from ..queue.admission import Admission
from .package import Unavailable, decode_items, fail_raw, package_order, package_payload, raw_items, timed
from .results import crashed, expired, result_of
from .store import JobStore
from .writer import Outcomes, ResultWriter

log = get_logger("workers.jobs.task")

# A package runs up to this many time limits while it makes progress (arq's timeout sits above);
# waiting behind a slowed backend that still delivers has no cap (workers/core/progress.py).
MAX_RUN_LIMITS = 6
# A package whose Redis went away is put back in line when it answers again, tried every 0.5 s.
OUTAGE_REQUEUE_TRIES = 60


class WorkerState:
    """Everything a package needs, shared by all concurrent packages of this process."""

    def __init__(
        self,
        config: WorkerConfig,
        redis: Any,
        *,
        dispatch: DispatchSettings | None = None,
        webhooks: WebhookSettings | None = None,
    ) -> None:
        self.config = config
        self.keys = Keys(config.prefix)
        self.store = JobStore(redis, self.keys, config.result_ttl_s, config.max_result_bytes)
        self.webhooks = Webhooks(redis, self.keys, webhooks)
        self.backend = TritonBackend(config.triton_url, timeout_s=config.triton_timeout_s)
        self.local = LocalHandlers(config, self.backend, CancelWatch(redis, self.keys))
        self.dispatch = Dispatcher(config, redis, self.local, self.backend, dispatch)
        self.backend.replicas.overflowing = self.dispatch.router.triton_overloaded  # backups take the excess
        self.draining = False  # set on shutdown: a cancelled package re-queues what is left
        self.admission = {
            lane: Admission(
                config.job_timeout_s,
                hold_s=config.admission_hold_s,
                floor_items=config.admission_floor_items,
                package_items=DEFAULT_CHUNK_SIZE if lane == Lane.bulk else DEFAULT_PACK_SIZE,
            )
            for lane in Lane
        }
        self.blocks = BlockRunner(config, self.store, self.local, self.dispatch, self.admission)

    async def aclose(self) -> None:
        await self.webhooks.aclose()
        await self.dispatch.aclose()
        await self.local.aclose()
        await self.backend.aclose()

    # ------------------------------------------------------------------ package

    async def run_package(self, payload: Any, *, package_id: str, job_try: int) -> dict[str, int]:
        structlog.contextvars.bind_contextvars(package_id=package_id)
        started = time.perf_counter()
        if (
            job_try == 1
            and isinstance(payload, dict)
            and not (payload.get("crashes") or payload.get("retries"))
        ):
            if (planned := self.blocks.plan(payload)) is not None:  # a chunk of texts: arrays end to end
                return await self.blocks.run(planned, package_id, self.clock())
        payload = package_payload(payload)
        items, malformed = decode_items(payload)
        if malformed:  # before any early return below: a malformed item fails, whatever its mates do
            await fail_raw(self.store, malformed, ErrorType.invalid_request, "malformed work item")
        if not items:
            return {"items": 0}
        lane = items[0].lane
        self.admission[lane].started(package_id, len(items))
        retries = int(payload.get("retries", 0))
        order = package_order(payload)
        # arq's job_try counts runs of *this* package; earlier packages' crashes travel in it.
        crashes = int(payload.get("crashes", 0)) + job_try - 1
        if job_try > 1 and len(items) > 1 and crashes < self.config.max_tries:
            # Each half starts as a fresh arq job: it runs once, and splits again only if it dies too.
            # Behind its tenant's queued work, not at its old place: a package that crashed may hold
            # the poison, and at the front it would run again at once, into the next crash.
            await self.store.requeue(items, lane, parts=2, crashes=crashes)
            log.warning("package re-run split to isolate a crash", items=len(items), crashes=crashes)
            PACKAGES.labels(lane.value, "split").inc()
            return {"split": len(items)}
        flags = await self.store.start(items)
        live = []
        for item, flag in zip(items, flags, strict=True):
            if flag > 0:
                item.attempt = flag
                live.append(item)
            elif flag == -2:
                log.error("not a job record; item skipped", job_id=item.id)
        picked = time.time()
        admission = self.admission[lane]
        writer = ResultWriter(
            self.store, self.webhooks, live, lane.value, lambda n: admission.progress(package_id, n)
        )
        if crashes >= self.config.max_tries:
            writer.add([crashed(item, crashes, picked) for item in live])
        else:
            clock = self.clock()
            try:
                waiting = await within(clock, self._execute(live, picked, retries, writer))
            except asyncio.CancelledError:
                if not self.draining:
                    raise
                return await self._drained(live, writer, lane, package_id, crashes, order)
            except TimeoutError:
                # What came back before the limit is kept; only the rest runs again.
                await writer.drain()
                rest = [i for i in live if i.id not in writer.handed]
                if rest:
                    await self.store.requeue(
                        rest, lane, parts=min(2, len(rest)), crashes=crashes + 1, order_us=order
                    )
                self.admission[lane].finished(package_id, len(writer.handed))
                log.warning(
                    "package timed out, re-queued",
                    items=len(rest),
                    kept=len(writer.handed),
                    crashes=crashes + 1,
                )
                PACKAGES.labels(lane.value, "timeout").inc()
                return {"timed_out": len(rest), "finished": len(writer.handed)}
            if waiting:
                await self._retry_later(waiting, lane, retries, order)
        await writer.drain()
        self.admission[lane].finished(package_id, len(writer.handed))
        PACKAGES.labels(lane.value, "done").inc()
        (log.warning if writer.failed else log.debug)(
            "package done",
            items=len(items),
            ran=len(live),
            failed=writer.failed,
            ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return {"items": len(items), "finished": len(writer.handed)}

    async def _drained(
        self,
        live: list[WorkItem],
        writer: ResultWriter,
        lane: Lane,
        package_id: str,
        crashes: int,
        order: int | None,
    ) -> dict[str, int]:
        """This worker is shutting down: what came back stays written, the rest goes back to the
        queue as new packages with the same crash count (a drain is not a crash, so they are not
        split), and the package ends here instead of being run again as a whole."""
        await writer.drain()
        rest = [i for i in live if i.id not in writer.handed]
        if rest:
            await self.store.requeue(rest, lane, crashes=crashes, order_us=order)
        self.admission[lane].finished(package_id, len(writer.handed))
        PACKAGES.labels(lane.value, "drained").inc()
        log.warning("package drained, re-queued", items=len(rest), kept=len(writer.handed))
        return {"drained": len(rest), "finished": len(writer.handed)}

    async def release(self, payload: Any, job_try: int, why: str = "drain") -> dict[str, int]:
        """Put a package back as a new one with its crash count unchanged (cancelled by the drain,
        or cut off from Redis): its finished items are skipped when it runs again."""
        payload = package_payload(payload)
        items, _ = decode_items(payload)
        if items:
            crashes = int(payload.get("crashes", 0)) + job_try - 1
            await self.store.requeue(items, items[0].lane, crashes=crashes, order_us=package_order(payload))
        log.warning("package released, re-queued", why=why, items=len(items))
        return {"drained": len(items)}

    def clock(self) -> PackageClock:
        """A new package's time limit (see :mod:`workers.core.progress`)."""
        limit = self.config.job_timeout_s
        return PackageClock(limit, max_wait_s=MAX_RUN_LIMITS * limit, max_run_s=MAX_RUN_LIMITS * limit)

    async def _execute(
        self, live: list[WorkItem], picked: float, retries: int, writer: ResultWriter
    ) -> list[WorkItem]:
        """Run the package's jobs, handing each result to ``writer`` as it comes back.

        Returns the jobs that found no backend available (to try again later).
        """
        now = time.time()
        writer.add([expired(i, picked, retries) for i in live if i.deadline_at < now])
        runnable = [i for i in live if i.deadline_at >= now]
        waiting: list[WorkItem] = []

        def settled(index: int, outcome: Dispatched | Exception) -> None:
            result = self._outcome(runnable[index], outcome, picked)
            if isinstance(result, Unavailable):
                waiting.append(runnable[index])
            else:
                writer.add([result])

        if runnable:
            await self.dispatch.run_many(runnable, out=Outcomes(len(runnable), settled))
        settled_ids = writer.handed.union(i.id for i in waiting)
        waiting += [i for i in runnable if i.id not in settled_ids]  # never dispatched: try again
        return waiting

    def _outcome(
        self, item: WorkItem, outcome: Dispatched | Exception, picked: float
    ) -> JobResult | Unavailable:
        """One job's result from what dispatch gave it; an unavailable backend means later."""
        if isinstance(outcome, BackendUnavailable):
            return Unavailable(outcome.message)
        if isinstance(outcome, DeadlineShed):
            error = ErrorInfo(type=outcome.type, message=outcome.message)
            return result_of(item, picked, Status.expired, error=error, route=Route.local)
        if isinstance(outcome, StreamCancelled):  # its reader went away: generation was stopped
            error = ErrorInfo(type=outcome.type, message=outcome.message)
            return result_of(
                item, picked, Status.cancelled, error=error, route=getattr(outcome, "route", None)
            )
        if isinstance(outcome, ItemError | InferenceFailed | StreamInterrupted):
            log.warning("job failed", job_id=item.id, error_type=outcome.type, error=outcome.message)
            error = ErrorInfo(type=outcome.type, message=outcome.message)
            return result_of(item, picked, Status.failed, error=error, route=getattr(outcome, "route", None))
        if isinstance(outcome, Exception):  # never let one job take the package down
            log.error("job crashed", job_id=item.id, exc_info=outcome)
            error = ErrorInfo(type=ErrorType.internal_error, message=type(outcome).__name__)
            return result_of(item, picked, Status.failed, error=error, route=getattr(outcome, "route", None))
        answer = outcome.answer
        timings = timed(answer.batch_ms, answer.infer_ms, answer.batch_size)
        return result_of(
            item,
            picked,
            Status.succeeded,
            body=answer.body,
            model=answer.model,
            route=outcome.route,
            reason=outcome.reason,
            timings=timings,
        )

    async def _retry_later(self, items: list[WorkItem], lane: Any, retries: int, order: int | None) -> None:
        delay = min(self.config.retry_backoff_s * 2**retries, self.config.retry_backoff_max_s)
        await self.store.requeue(items, lane, defer_s=delay, retries=retries + 1, order_us=order)
        log.warning("backend unavailable, jobs wait", items=len(items), retry_in_s=delay, retries=retries + 1)


async def run_items(ctx: dict[str, Any], payload: Any = None, *args: Any, **kwargs: Any) -> dict[str, int]:
    """The arq function named ``producer.contract.TASK_NAME``.

    Nothing a package run raises leaves its jobs open: an unreachable Redis puts the package
    back in its tenant's line once Redis answers (arq keeps it if it never does); any other
    error fails every item of the package that is not terminal yet (``internal_error``).
    """
    state: WorkerState = ctx["state"]
    structlog.contextvars.clear_contextvars()
    try:
        return await state.run_package(payload, package_id=ctx["job_id"], job_try=ctx["job_try"])
    except asyncio.CancelledError:
        if not state.draining:
            raise
        # Cancelled by the drain outside the package's own drain path (claiming its items,
        # writing its last results): re-queued here rather than by arq, whose re-run would
        # count the drain as a crash and split the package.
        return await state.release(payload, ctx["job_try"])
    except (RedisError, OSError) as exc:
        # Raised, arq would record the package as failed and take it off its queue once Redis
        # answers again, leaving its jobs running for ever. Put it back in line instead (the
        # jobs already terminal are skipped when it runs again); arq keeps it if Redis stays away.
        log.warning("redis lost mid-package; re-queueing it", error=repr(exc)[:200])
        for _ in range(OUTAGE_REQUEUE_TRIES):
            with contextlib.suppress(RedisError, OSError):
                return await state.release(payload, ctx["job_try"], why="redis outage")
            await asyncio.sleep(0.5)
        raise RetryJob() from exc
    except Exception as exc:
        log.exception("work package crashed; its open jobs fail", package_id=ctx["job_id"])
        items = raw_items(payload)
        failed = await fail_raw(
            state.store,
            items,
            ErrorType.internal_error,
            f"the work package could not run ({type(exc).__name__})",
        )
        return {"crashed": failed}


async def run_unknown_task(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, int]:
    """Runs a package queued under a task name this worker does not know: its jobs fail."""
    state: WorkerState = ctx["state"]
    payload = args[0] if args else kwargs.get("payload")
    items = raw_items(payload)
    failed = await fail_raw(
        state.store, items, ErrorType.invalid_request, "the work package names an unknown task"
    )
    log.error("work package for an unknown task", package_id=ctx["job_id"], failed=failed)
    return {"failed": failed}
