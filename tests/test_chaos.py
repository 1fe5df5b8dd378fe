"""Faults under load: the system keeps its promises while its parts fail.

Each test runs real processes (a private ``redis-server`` with AOF, real workers, the session's
Triton), is bounded in time, and counts every job it submitted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from arq.constants import job_key_prefix
from arq.jobs import serialize_job

from producer import Client
from producer.contract import TASK_NAME, pack_job
from stack.processes import ManagedProcess, free_port, python_process, redis_process
from tests.conftest import Triton, WorkerFactory, start_triton, worker_env
from tests.fixtures_remote import FakeRemote

FIXED = "fixed-cost"


@pytest.fixture
def private_redis(run_dir: Path) -> Iterator[tuple[ManagedProcess, int]]:
    """A redis-server of this test only (AOF, fsync every second): it may be killed."""
    port = free_port()
    server = redis_process(port, run_dir).start()
    yield server, port
    server.stop()


async def submit_for(client: Client, seconds: float, tag: str) -> tuple[list[str], int]:
    """Submit batches of jobs for ``seconds``; the ids accepted, and how many submits failed."""
    accepted: list[str] = []
    refused = 0
    until = time.monotonic() + seconds
    n = 0
    while time.monotonic() < until and n < 400:
        n += 1
        try:
            accepted += await client.submit_many(
                [("embed", {"model": FIXED, "input": f"{tag}{n}-{i}"}) for i in range(25)]
            )
        except Exception:  # Redis is down: nothing was accepted, the producer retries later
            refused += 1
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.02)
    return accepted, refused


async def test_a_redis_restart_mid_run_loses_nothing_and_keeps_the_worker(
    private_redis: tuple[ManagedProcess, int], triton: Triton, run_dir: Path
) -> None:
    server, port = private_redis
    url = f"redis://127.0.0.1:{port}/0"
    env = worker_env(url, triton, "chaos", job_timeout_s=5)
    worker = python_process("worker", "workers", run_dir, env, log_name="worker-chaos-redis").start()
    try:
        async with Client(url, prefix="chaos") as client:
            before = await client.submit_many(
                [("embed", {"model": FIXED, "input": f"before {i}"}) for i in range(2000)]
            )
            await asyncio.sleep(0.5)  # the worker is mid-run: some done, some in flight, most queued
            await asyncio.sleep(1.2)  # AOF fsyncs every second: what was accepted is on disk
            server.kill()
            during, refused = await submit_for(client, 2.0, "during")
            server.start()  # same port, same directory: the AOF brings every record back
            restarted = time.monotonic()
            after = await client.submit_many(
                [("embed", {"model": FIXED, "input": f"after {i}"}) for i in range(200)]
            )
            ids = before + during + after
            results = await client.wait_many(ids, timeout=60)
            took = time.monotonic() - restarted
        assert worker.alive(), "the worker exited when Redis went away"
        statuses = [r.status.value for r in results]
        assert statuses.count("succeeded") == len(ids), {s: statuses.count(s) for s in set(statuses)}
        assert took < 60
        assert refused > 0, "Redis was down while the producer submitted"
        log = worker.log_path.read_text(errors="replace")
        assert "redis reachable again" in log
    finally:
        worker.stop()


# ---------------------------------------------------------------------------- poison packages


def record() -> dict[str, Any]:
    """The job record a producer writes (see ``producer/contract/submit.lua``)."""
    return {
        "status": "queued",
        "kind": "embed",
        "tenant": "default",
        "created_at": time.time(),
        "attempts": 0,
    }


def item(job_id: str, **changes: Any) -> dict[str, Any]:
    now = time.time()
    raw = {"id": job_id, "kind": "embed", "body": {"model": FIXED, "input": job_id}, "created_at": now}
    return {**raw, "deadline_at": now + 60, **changes}


async def queue_raw(client: Client, package_id: str, args: tuple[Any, ...], task: str = TASK_NAME) -> None:
    """A package written straight into Redis in arq's format, as any producer could."""
    now = time.time()
    data = serialize_job(task, args, {}, 1, int(now * 1000), serializer=pack_job)
    await client.redis.psetex(job_key_prefix + package_id, 60_000, data)
    await client.redis.zadd(client.keys.queue("interactive"), {package_id: int(now * 1000)})


async def records(client: Client, *job_ids: str) -> None:
    for job_id in job_ids:
        await client.redis.hset(client.keys.job(job_id), mapping=record())


class TestPoisonPackages:
    """Whatever a package holds, the worker stays up and every job it names ends terminal."""

    async def test_an_unknown_task_name_fails_its_jobs(
        self, client: Client, start_worker: WorkerFactory
    ) -> None:
        worker = start_worker()
        await records(client, "job_unknown_task")
        await queue_raw(client, "pkg_unknown", ({"items": [item("job_unknown_task")]},), task="no_such_task")
        result = await client.wait("job_unknown_task", timeout=30)
        assert result.status == "failed" and result.error.type == "invalid_request"
        await self.assert_still_serving(client, worker)

    async def test_a_payload_that_is_not_a_map(self, client: Client, start_worker: WorkerFactory) -> None:
        worker = start_worker()
        await records(client, "job_listed")
        await queue_raw(client, "pkg_string", ("not a package",))
        await queue_raw(client, "pkg_list", ([item("job_listed")],))  # a bare list: its items run
        assert (await client.wait("job_listed", timeout=30)).status == "succeeded"
        await self.assert_still_serving(client, worker)

    async def test_a_record_of_the_wrong_type_spoils_no_package_mate(
        self, client: Client, start_worker: WorkerFactory
    ) -> None:
        worker = start_worker()
        await records(client, "job_mate_a", "job_mate_b")
        await client.redis.set(client.keys.job("job_not_a_hash"), "a string, not a job record")
        package = [item("job_mate_a"), item("job_not_a_hash"), item("job_mate_b")]
        await queue_raw(client, "pkg_wrong_type", ({"items": package},))
        results = await client.wait_many(["job_mate_a", "job_mate_b"], timeout=30)
        assert [r.status for r in results] == ["succeeded", "succeeded"]
        assert await client.redis.get(client.keys.job("job_not_a_hash")) == "a string, not a job record"
        await self.assert_still_serving(client, worker)

    async def test_an_item_with_an_id_but_no_valid_kind_fails_its_own_job(
        self, client: Client, start_worker: WorkerFactory
    ) -> None:
        worker = start_worker()
        await records(client, "job_bad_kind", "job_good_kind")
        package = [item("job_bad_kind", kind="nonsense"), item("job_good_kind")]
        await queue_raw(client, "pkg_bad_kind", ({"items": package},))
        bad, good = await client.wait_many(["job_bad_kind", "job_good_kind"], timeout=30)
        assert bad.status == "failed" and bad.error.type == "invalid_request"
        assert good.status == "succeeded"
        await self.assert_still_serving(client, worker)

    async def test_a_package_that_crashes_the_run_fails_its_open_jobs(
        self, client: Client, start_worker: WorkerFactory
    ) -> None:
        worker = start_worker()
        await records(client, "job_in_a_crash")
        await queue_raw(
            client, "pkg_crash", ({"items": [item("job_in_a_crash")], "retries": "not a number"},)
        )
        result = await client.wait("job_in_a_crash", timeout=30)
        assert result.status == "failed" and result.error.type == "internal_error"
        await self.assert_still_serving(client, worker)

    async def assert_still_serving(self, client: Client, worker: ManagedProcess) -> None:
        job_id = await client.submit("embed", {"model": FIXED, "input": "after the poison"})
        assert (await client.wait(job_id, timeout=30)).status == "succeeded"
        assert worker.alive()


# ---------------------------------------------------------------------------- deep backlog


async def test_a_deep_backlog_is_worked_off_without_re_runs(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    """6 000 jobs at once, a model that serves about 1 300 items/s and a 3 s time limit: the
    worker claims only what it can finish in time, so (almost) no package times out."""
    triton.set_exec_ms(50)
    try:
        await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s
        start_worker(job_timeout_s=3)
        ids: list[str] = []
        for start in range(0, 6000, 1000):
            ids += await client.submit_many(
                [("embed", {"model": FIXED, "input": f"backlog {i}"}) for i in range(start, start + 1000)]
            )
        started = time.monotonic()
        results = await client.wait_many(ids, timeout=120)
        took = time.monotonic() - started
    finally:
        triton.set_exec_ms(5)
    statuses = [r.status.value for r in results]
    assert statuses.count("succeeded") == len(ids), {s: statuses.count(s) for s in set(statuses)}
    mean_attempts = sum(r.attempts for r in results) / len(results)
    print(f"\nbacklog: {len(ids)} jobs in {took:.1f}s, mean attempts {mean_attempts:.3f}")
    assert mean_attempts <= 1.05


async def test_a_backend_slowed_five_times_mid_run_degrades_goodput_without_re_runs(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    """The model's cost goes from 100 to 500 ms per execution mid-run, then back; the time limit
    (1 s) is shorter than a request's wait in Triton's queue while it is slow (4 in flight × 500
    ms). The packages queued there keep their work (batches still come back: a slowdown, not a
    stall), so nothing is computed twice, work goes on through the slow phase, and all finish."""
    triton.set_exec_ms(100)
    try:
        await asyncio.sleep(0.7)  # the model re-reads its cost within 0.5 s
        start_worker(job_timeout_s=1)
        ids = await client.submit_many(
            [("embed", {"model": FIXED, "input": f"slow {i}"}) for i in range(3000)], lane="bulk"
        )
        await asyncio.sleep(1.5)
        triton.set_exec_ms(500)
        slow_from = time.time() + 0.5
        await asyncio.sleep(4.5)
        triton.set_exec_ms(100)
        slow_to = time.time()
        results = await client.wait_many(ids, timeout=120)
    finally:
        triton.set_exec_ms(5)
    statuses = [r.status.value for r in results]
    assert statuses.count("succeeded") == len(ids), {s: statuses.count(s) for s in set(statuses)}
    during = sum(slow_from <= r.finished_at <= slow_to for r in results if r.finished_at)
    attempts = sum(r.attempts for r in results) / len(results)
    print(f"\nslowdown: {during} jobs finished in the 4 s at 500 ms, mean attempts {attempts:.3f}")
    assert attempts <= 1.02
    assert during >= 128  # about 128 items/s at 500 ms per batch of 64: at least a second's worth


# ---------------------------------------------------------------------------- repeated kills


async def run_with_kills(
    client: Client, start_worker: WorkerFactory, n: int, kills: int, tag: str
) -> tuple[float, list[Any], list[int]]:
    """Two workers; every 2 s one of them is SIGKILLed and a new one started, ``kills`` times."""
    workers = [start_worker(), start_worker()]
    ids: list[str] = []
    started = time.monotonic()
    for start in range(0, n, 1000):
        ids += await client.submit_many(
            [("embed", {"model": FIXED, "input": f"{tag} {i}"}) for i in range(start, min(n, start + 1000))]
        )
    for k in range(kills):
        await asyncio.sleep(2.0)
        workers[k % 2].kill()
        workers[k % 2] = start_worker()
    results = await client.wait_many(ids, timeout=180)
    took = time.monotonic() - started
    markers = [await client.redis.llen(client.keys.done(i)) for i in ids]
    for w in workers:
        w.stop()
    return took, results, markers


async def test_repeated_sigkills_lose_nothing_and_keep_most_of_the_goodput(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    """8 000 jobs on a model serving about 1 300 items/s, default time limit; a worker killed
    every 2 s, 5 times, against the same run with no kill."""
    triton.set_exec_ms(50)
    try:
        await asyncio.sleep(0.7)
        calm_s, calm, _ = await run_with_kills(client, start_worker, 8000, 0, "calm")
        chaos_s, chaos, markers = await run_with_kills(client, start_worker, 8000, 5, "chaos")
    finally:
        triton.set_exec_ms(5)
    assert {r.status.value for r in calm} == {"succeeded"}
    statuses = [r.status.value for r in chaos]
    assert statuses.count("succeeded") == 8000, {s: statuses.count(s) for s in set(statuses)}
    assert set(markers) == {1}, "a job was written twice (or never)"
    ratio = calm_s / chaos_s
    attempts = sum(r.attempts for r in chaos) / len(chaos)
    print(
        f"\nkills: no fault {calm_s:.1f}s, 5 kills {chaos_s:.1f}s, goodput ratio {ratio:.2f}, mean attempts {attempts:.2f}"
    )
    # Loose on purpose: in a run this short, a kill near the end leaves its packages waiting out
    # their 5 s lease, so the ratio swings with when the kills land (0.49-0.64 seen here);
    # `python -m bench chaos` measures the goodput over 20 kills in a 10 000-job run.
    assert ratio >= 0.4


# ---------------------------------------------------------------------------- overload


async def test_overload_sheds_by_deadline_instead_of_computing_late_results(
    client: Client, start_worker: WorkerFactory, triton: Triton
) -> None:
    """8 000 jobs with a 3 s deadline on a model that serves about 1 300 items/s and no remote:
    what cannot finish in time expires before inference; what runs, finishes in time."""
    triton.set_exec_ms(50)
    try:
        await asyncio.sleep(0.7)
        start_worker()
        await client.wait(await client.submit("embed", {"model": FIXED, "input": "warm"}), timeout=30)
        ids: list[str] = []
        for start in range(0, 8000, 1000):
            batch = [("embed", {"model": FIXED, "input": f"rush {i}"}) for i in range(start, start + 1000)]
            ids += await client.submit_many(batch, deadline=3)
        results = await client.wait_many(ids, timeout=60)
    finally:
        triton.set_exec_ms(5)
    succeeded = [r for r in results if r.status.value == "succeeded"]
    late = [r for r in succeeded if (r.finished_at or 0) > r.created_at + 3 + 1.0]
    in_time = len(succeeded) - len(late)
    expired = [r for r in results if r.status.value == "expired"]
    print(f"\noverload: {in_time} in time, {len(late)} late, {len(expired)} expired of {len(results)}")
    assert len(succeeded) + len(expired) == len(results)
    assert in_time >= 3000, "the model's capacity for those 3 s went to jobs that made their deadline"
    assert len(late) <= 0.1 * in_time, "work was spent on results nobody waits for"


# ---------------------------------------------------------------------------- both backends down


async def test_triton_down_and_the_remote_failing_together_lose_nothing(
    client: Client, start_worker: WorkerFactory, fake_remote: FakeRemote, run_dir: Path
) -> None:
    """Hybrid mode under load; Triton is killed and the remote answers 503 at the same time.
    Jobs wait (none fails), every job ends with its route, and local_only ones never reach the
    remote, whichever backend comes back."""
    (run_dir / "both-down").mkdir(exist_ok=True)
    own = start_triton(run_dir / "both-down", models=["fixed_cost"])
    ports = tuple(
        int(u.rsplit(":", 1)[1].split("/")[0]) for u in (own.http_url, own.grpc_url, own.metrics_url)
    )
    start_worker(
        triton_server=own,
        remote_base_url=fake_remote.base_url,
        remote_same_models=f'["{FIXED}"]',
        remote_max_retries=1,
        remote_backoff_s=0.05,
        remote_circuit_reset_s=1.0,
    )

    async def burst(tag: str, n: int) -> list[tuple[str, bool]]:
        secret = [i % 3 == 0 for i in range(n)]
        ids = await asyncio.gather(
            *(
                client.submit(
                    "embed",
                    {"model": FIXED, "input": f"secret {tag} {i}" if s else f"{tag} {i}"},
                    local_only=s,
                )
                for i, s in enumerate(secret)
            )  # fmt: skip
        )
        return list(zip(ids, secret, strict=True))

    try:
        jobs = await burst("before", 150)
        own.process.kill()
        fake_remote.control(mode="503")
        jobs += await burst("outage", 300)
        await asyncio.sleep(3.0)
        outage = [await client.get(job_id) for job_id, _ in jobs[150:]]
        assert not [r for r in outage if r.status.value in ("failed", "expired")], (
            "a job failed in the outage"
        )
        own = start_triton(run_dir / "both-down", ports=ports, models=["fixed_cost"])  # type: ignore[arg-type]
        fake_remote.control(mode="ok")
        results = await client.wait_many([job_id for job_id, _ in jobs], timeout=90)
    finally:
        own.process.stop()
    assert [r.status.value for r in results] == ["succeeded"] * len(jobs)
    assert all(r.route is not None for r in results)
    secret_routes = {str(r.route) for (_, s), r in zip(jobs, results, strict=True) if s}
    assert secret_routes == {"local"}
    assert [r for r in fake_remote.requests() if "secret" in str(r.get("body"))] == []
