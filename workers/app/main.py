"""Run a worker process: one arq Worker per lane, sharing batchers and backends.

Both lanes live in one event loop so their jobs meet in the same micro-batchers; the bulk
lane takes fewer packages at a time and its items queue behind interactive ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal

from arq.connections import RedisSettings
from arq.worker import Worker, func
from prometheus_client import start_http_server

from producer.contract import (
    TASK_NAME,
    Keys,
    Lane,
    arq_redis_settings,
    configure_logging,
    create_arq_pool,
    get_logger,
    pack_job,
    unpack_job,
)

from ..core.metrics import BACKLOG, QUEUE_DEPTH, install_gc_metrics
from ..core.settings import WorkerConfig
from ..delivery.outbox import Outbox
from ..delivery.task import build_webhook_worker
from ..jobs.task import MAX_RUN_LIMITS, WorkerState, run_items, run_unknown_task
from ..queue.shares import SharePublisher
from ..queue.worker import PackageWorker
from .catalogue import publish_catalogue
from .settings import Settings
from .status import StatusReporter

log = get_logger("workers.app.main")


def build_workers(config: WorkerConfig, state: WorkerState, redis_settings: RedisSettings) -> list[Worker]:
    keys = Keys(config.prefix)
    # arq's limits sit just above ours (the most a package may run), so our code always sees a
    # package's last run and its timeout (arq would fail a job it times out, or one past
    # max_tries, without telling us).
    tries = config.max_tries + 1
    timeout = config.job_timeout_s * MAX_RUN_LIMITS + 5
    task = func(run_items, name=TASK_NAME, timeout=timeout, keep_result=0, max_tries=tries)
    workers = []
    for lane in config.lanes:
        workers.append(
            PackageWorker(
                functions=[task],
                queue_name=keys.queue(lane),
                redis_settings=redis_settings,
                ctx={"state": state},
                unknown_task=run_unknown_task,
                admission=state.admission[lane] if config.admission else None,
                lease_s=config.package_lease_s,
                fair=(keys.fair(lane), keys.shares()),
                handle_signals=False,
                max_jobs=config.max_jobs if lane == Lane.interactive else config.bulk_max_jobs,
                poll_delay=config.poll_delay_s,
                keep_result=0,
                max_tries=tries,
                job_serializer=pack_job,
                job_deserializer=unpack_job,
                expires_extra_ms=7 * 24 * 3600 * 1000,
                log_results=False,
                health_check_interval=5,
            )
        )
    workers.append(build_webhook_worker(keys, state.webhooks, redis_settings))
    return workers


async def _sample_gauges(config: WorkerConfig, state: WorkerState) -> None:
    while True:
        for lane in config.lanes:
            with contextlib.suppress(Exception):
                QUEUE_DEPTH.labels(lane.value).set(await state.store.queue_depth(lane))
        for name, batcher in state.local.batchers.items():
            BACKLOG.labels(name).set(batcher.backlog)
        await asyncio.sleep(1.0)


async def serve(settings: Settings) -> None:
    config = settings.worker
    redis_settings = arq_redis_settings(config.redis_url)  # a plain URL or Sentinel
    redis = await create_arq_pool(redis_settings, job_serializer=pack_job, job_deserializer=unpack_job)
    state = WorkerState(config, redis, dispatch=settings.dispatch, webhooks=settings.webhooks)
    state.dispatch.start()  # routing signals are sampled from the start, not on the first job
    await publish_catalogue(redis, config, state.dispatch.remote)  # for the API's /v1/models
    if config.metrics_port:
        start_http_server(config.metrics_port, addr=config.metrics_host)
    workers = build_workers(config, state, redis_settings)
    # Start-up objects (modules, clients, models) live as long as the process: take them out of
    # the collector's view, so a full collection walks only what jobs allocate (shorter pauses).
    gc.freeze()
    gc.set_threshold(*config.gc_threshold)
    install_gc_metrics()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runs = [asyncio.create_task(_keep_running(w), name=f"arq:{w.queue_name}") for w in workers]
    outbox = Outbox(state.webhooks)
    deliveries = asyncio.create_task(outbox.run(), name="webhook outbox")
    sampler = asyncio.create_task(_sample_gauges(config, state))
    status = StatusReporter(redis, Keys(config.prefix), state, workers)  # for the API's console
    status.start()
    tenants_file = settings.webhooks.tenants_file
    shares = SharePublisher(redis, Keys(config.prefix), tenants_file) if tenants_file else None
    if shares is not None:
        shares.start()
    log.info("worker started", lanes=[lane.value for lane in config.lanes], triton=config.triton_url)
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*runs, stopper], return_when=asyncio.FIRST_COMPLETED)
    for t in done:
        if t is not stopper and t.exception():
            log.error("arq worker loop died", error=repr(t.exception()))
    await _drain(workers, config.shutdown_grace_s, state)
    deliveries.cancel()  # no more claims; the POSTs in flight get their time below
    with contextlib.suppress(asyncio.CancelledError):
        await deliveries
    await outbox.aclose(min(config.shutdown_grace_s, settings.webhooks.webhook_timeout_s))
    sampler.cancel()
    with contextlib.suppress(Exception):
        await status.aclose()
    if shares is not None:
        await shares.aclose()
    for run in runs:
        run.cancel()
    for w in workers:
        try:
            await w.close()
        except Exception as exc:  # shutdown goes on: every package left re-runs elsewhere
            log.warning("worker close failed", queue=w.queue_name, error=repr(exc)[:200])
    with contextlib.suppress(Exception):
        await state.aclose()
    with contextlib.suppress(Exception):
        await redis.aclose()
    log.info("worker stopped")


async def _keep_running(worker: Worker) -> None:
    """arq's loop, started again if it ever ends with an error (e.g. Redis down at start-up)."""
    wait_s = 0.5
    while True:
        try:
            await worker.async_run()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("arq worker loop died; restarting it", queue=worker.queue_name, error=repr(exc)[:200])
            await asyncio.sleep(wait_s)
            wait_s = min(wait_s * 2, 10.0)


async def _drain(workers: list[Worker], grace_s: float, state: WorkerState) -> None:
    """Stop picking packages, give running ones ``grace_s`` to finish, then put the rest back
    in the queue for another worker (not left to wait out their lease)."""
    for w in workers:
        w.allow_pick_jobs = False
    running = [t for w in workers for t in w.tasks.values() if not t.done()]
    if running:
        log.info("draining", packages=len(running), grace_s=grace_s)
        await asyncio.wait(running, timeout=grace_s)
    state.draining = True  # the packages cancelled below re-queue what they have left
    for w in workers:
        if isinstance(w, PackageWorker):
            # A runner that cannot reach Redis to re-queue leaves its package to the lease.
            released = await w.release_unfinished()
            if released:
                log.warning("drain time over: packages re-queued", queue=w.queue_name, packages=released)


def main() -> None:
    settings = Settings.from_env()  # the one settings root of this process
    configure_logging(settings.worker.log_level, settings.worker.log_json)
    asyncio.run(serve(settings))
