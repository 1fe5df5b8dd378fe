"""MicroBatcher, against an in-memory backend: how it forms batches and isolates failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from workers.backends.local import MicroBatcher
from workers.backends.local.lines import pick_similar
from workers.core import BackendUnavailable, InferenceFailed, ModelError


class Recorder:
    """A fake backend that records the batches it receives."""

    def __init__(self, *, delay: float = 0.0, poison: str | None = None, crash: str | None = None) -> None:
        self.batches: list[list[Any]] = []
        self.delay = delay
        self.poison = poison
        self.crash = crash

    async def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        await asyncio.sleep(self.delay)
        if self.crash in items:
            raise InferenceFailed("the model raised on this request")
        return [ModelError("poisoned") if i == self.poison else f"out:{i}" for i in items]


async def test_concurrent_submissions_share_one_batch() -> None:
    backend = Recorder()
    batcher: MicroBatcher[str] = MicroBatcher("m", backend, max_batch=64, max_wait_ms=20)
    outcomes = await asyncio.gather(*(batcher.submit(f"x{i}") for i in range(10)))
    await batcher.aclose()
    assert [o.value for o in outcomes] == [f"out:x{i}" for i in range(10)]
    assert len(backend.batches) == 1
    assert all(o.batch_size == 10 for o in outcomes)


async def test_a_full_batch_flushes_without_waiting() -> None:
    backend = Recorder()
    batcher: MicroBatcher[int] = MicroBatcher("m", backend, max_batch=4, max_wait_ms=10_000)
    outcomes = await asyncio.wait_for(batcher.submit_many(list(range(8))), timeout=2)
    await batcher.aclose()
    assert [len(b) for b in backend.batches] == [4, 4]
    assert [o.value for o in outcomes] == [f"out:{i}" for i in range(8)]


async def test_a_lone_item_waits_at_most_the_window() -> None:
    batcher: MicroBatcher[int] = MicroBatcher("m", Recorder(), max_batch=64, max_wait_ms=5)
    started = asyncio.get_running_loop().time()
    await batcher.submit(1)
    await batcher.aclose()
    assert asyncio.get_running_loop().time() - started < 0.5


async def test_requests_go_out_at_once_while_a_slot_is_free_then_batches_grow() -> None:
    """No window while fewer than max_inflight requests are out; once all are, items accumulate."""
    backend = Recorder(delay=0.2)
    batcher: MicroBatcher[str] = MicroBatcher("m", backend, max_batch=64, max_wait_ms=10_000, max_inflight=2)
    started = asyncio.get_running_loop().time()
    first = asyncio.ensure_future(batcher.submit("a"))
    await asyncio.sleep(0.02)
    second = asyncio.ensure_future(batcher.submit("b"))  # one slot still free: out at once
    await asyncio.sleep(0.02)
    rest = asyncio.ensure_future(batcher.submit_many(["c", "d", "e"]))  # both slots busy: they wait
    await asyncio.gather(first, second, rest)
    await batcher.aclose()
    assert backend.batches == [["a"], ["b"], ["c", "d", "e"]]
    assert asyncio.get_running_loop().time() - started < 2  # never the 10 s window


async def test_a_partial_batch_waits_while_a_full_one_is_queued_behind_the_running_one() -> None:
    """Sent at once it would only queue in Triton, which does not split requests: beside a full
    one it would run as an execution of its own. Held, it goes when a request comes back."""
    backend = Recorder(delay=0.2)
    batcher: MicroBatcher[str] = MicroBatcher("m", backend, max_batch=4, max_wait_ms=0, max_inflight=4)
    full = asyncio.ensure_future(batcher.submit_many([f"f{i}" for i in range(8)]))
    await asyncio.sleep(0.02)
    late = asyncio.ensure_future(batcher.submit_many(["a", "b"]))  # two slots free, but covered
    await asyncio.sleep(0.1)
    assert len(backend.batches) == 2
    more = asyncio.ensure_future(batcher.submit_many(["c", "d", "e"]))  # now a full batch: out
    await asyncio.sleep(0.02)
    assert backend.batches[2] == ["a", "b", "c", "d"]
    await asyncio.gather(full, late, more)
    await batcher.aclose()
    assert backend.batches[3] == ["e"]  # went once requests came back


async def test_without_flush_when_free_the_window_gathers_a_batch() -> None:
    backend = Recorder()
    batcher: MicroBatcher[str] = MicroBatcher(
        "m", backend, max_batch=8, max_wait_ms=100, flush_when_free=False
    )
    first = asyncio.ensure_future(batcher.submit("a"))
    await asyncio.sleep(0.03)
    await asyncio.gather(first, batcher.submit("b"))
    await batcher.aclose()
    assert backend.batches == [["a", "b"]]


async def test_a_poisoned_item_fails_alone() -> None:
    batcher: MicroBatcher[str] = MicroBatcher("m", Recorder(poison="bad"), max_batch=32, max_wait_ms=10)
    items = [f"ok{i}" for i in range(31)] + ["bad"]
    outcomes = await batcher.submit_many(items)
    await batcher.aclose()
    assert isinstance(outcomes[-1].error, ModelError)
    assert all(o.error is None for o in outcomes[:-1])


async def test_a_request_level_crash_is_bisected_to_the_culprit() -> None:
    backend = Recorder(crash="boom")
    batcher: MicroBatcher[str] = MicroBatcher("m", backend, max_batch=32, max_wait_ms=10)
    items = [f"ok{i}" for i in range(20)] + ["boom"] + [f"ok{i}" for i in range(20, 31)]
    outcomes = await batcher.submit_many(items)
    await batcher.aclose()
    failed = [i for i, o in enumerate(outcomes) if o.error]
    assert failed == [20]
    assert isinstance(outcomes[20].error, InferenceFailed)
    assert len(backend.batches) <= 2 * 6  # log2(32) levels of halving, two requests each


async def test_an_unavailable_backend_fails_the_batch_without_bisecting() -> None:
    calls = 0

    async def down(items: list[Any]) -> list[Any]:
        nonlocal calls
        calls += 1
        raise BackendUnavailable("connection refused")

    batcher: MicroBatcher[int] = MicroBatcher("m", down, max_batch=8, max_wait_ms=1)
    outcomes = await batcher.submit_many(list(range(8)))
    await batcher.aclose()
    assert calls == 1
    assert all(isinstance(o.error, BackendUnavailable) for o in outcomes)


async def test_interactive_items_are_taken_before_bulk_ones() -> None:
    backend = Recorder(delay=0.05)
    batcher: MicroBatcher[str] = MicroBatcher("m", backend, max_batch=4, max_wait_ms=0, max_inflight=1)
    first = asyncio.ensure_future(batcher.submit("warmup"))
    await asyncio.sleep(0.01)  # the only slot is busy now; the rest queue up
    bulk = asyncio.ensure_future(batcher.submit_many(["b1", "b2", "b3", "b4"], priority=1))
    await asyncio.sleep(0)
    interactive = asyncio.ensure_future(batcher.submit_many(["i1", "i2"], priority=0))
    await asyncio.gather(first, bulk, interactive)
    await batcher.aclose()
    assert backend.batches[1][:2] == ["i1", "i2"]


async def test_backlog_grows_while_requests_are_in_flight() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(
        "m", Recorder(delay=0.1), max_batch=4, max_wait_ms=0, max_inflight=1
    )
    task = asyncio.ensure_future(batcher.submit_many(list(range(12))))
    await asyncio.sleep(0.05)
    assert batcher.backlog == 8
    await task
    await batcher.aclose()
    assert batcher.backlog == 0


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        MicroBatcher("m", Recorder(), max_batch=0)


async def test_a_token_aware_batcher_sends_similar_lengths_together_under_its_budget() -> None:
    """Each submission goes shortest first, and a request stops at max_batch_tokens (rows ×
    its longest row) as well as at max_batch; every outcome comes back in input order."""
    backend = Recorder(delay=0.05)
    batcher: MicroBatcher[str] = MicroBatcher(
        "m", backend, max_batch=4, max_wait_ms=0, max_inflight=1, cost=len, max_batch_tokens=12
    )
    items = ["x" * 6, "x", "xx", "x" * 5, "x" * 3, "x" * 10, "xx"]
    outcomes = await batcher.submit_many(items)
    await batcher.aclose()
    assert [o.value for o in outcomes] == [f"out:{i}" for i in items]
    assert [[len(i) for i in b] for b in backend.batches] == [[1, 2, 2, 3], [5, 6], [10]]
    assert all(len(b) * max(map(len, b)) <= 12 for b in backend.batches if len(b) > 1)


def test_pick_similar_takes_the_oldest_and_its_nearest_lengths_within_the_budget() -> None:
    costs = [30, 200, 28, 5, 31, 190, 29, 33]
    assert sorted(pick_similar(costs, 4, None)) == [0, 2, 4, 6]  # 30 with 28, 31, 29
    assert sorted(pick_similar(costs, 8, 4 * 33)) == [0, 2, 4, 6]  # a fifth row: 5 × 31 > 132
    assert sorted(pick_similar(costs, 8, 5 * 31)) == [0, 2, 3, 4, 6]  # the 5 fits, the 33 not
    assert pick_similar([50, 1, 2], 3, 40) == [0]  # alone over the budget: still goes
    assert sorted(pick_similar([300, 10, 290], 2, None)) == [0, 2]


async def test_with_a_lookahead_separate_submissions_are_grouped_by_length() -> None:
    """Concurrent interactive jobs of mixed lengths: each request holds similar ones, the
    oldest waiting item always among them."""
    backend = Recorder(delay=0.05)
    batcher: MicroBatcher[str] = MicroBatcher(
        "m", backend, max_batch=3, max_wait_ms=0, max_inflight=1, cost=len, lookahead=16
    )
    first = asyncio.ensure_future(batcher.submit("warm"))
    await asyncio.sleep(0.01)  # the only slot is busy: the rest queue up, one job each
    lengths = [2, 40, 3, 41, 2, 39, 42, 4, 3]
    jobs = [asyncio.ensure_future(batcher.submit("x" * n)) for n in lengths]
    outcomes = await asyncio.gather(first, *jobs)
    await batcher.aclose()
    assert [o.value for o in outcomes[1:]] == [f"out:{'x' * n}" for n in lengths]
    sizes = [sorted(len(i) for i in b) for b in backend.batches[1:]]
    assert sizes == [[2, 2, 3], [39, 40, 41], [3, 4, 42]]


async def test_tenants_lines_take_turns_so_a_small_tenant_rides_the_next_request() -> None:
    """Tenant a's 8 batches are queued first; tenant b's one batch goes out second, not ninth."""
    backend = Recorder(delay=0.01)
    batcher: MicroBatcher[str] = MicroBatcher("m", backend, max_batch=4, max_inflight=1)
    big = asyncio.create_task(batcher.submit_many([f"a{i}" for i in range(32)], 1, group="a"))
    await asyncio.sleep(0)  # a's items are queued (one request out already)
    small = await batcher.submit_many([f"b{i}" for i in range(4)], 1, group="b")
    assert [o.value for o in small] == [f"out:b{i}" for i in range(4)]
    assert [o.value for o in await big] == [f"out:a{i}" for i in range(32)]
    await batcher.aclose()
    firsts = [batch[0][0] for batch in backend.batches]
    assert firsts.index("b") <= 2
    assert [x for batch in backend.batches for x in batch if x[0] == "a"] == [f"a{i}" for i in range(32)]
