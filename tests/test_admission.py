"""Admission: a worker holds only the work its lane finishes in a short hold (2 s here)."""

from __future__ import annotations

from workers.queue import Admission


def make(time_limit_s: float = 20.0) -> tuple[Admission, list[float]]:
    now = [100.0]
    return Admission(time_limit_s, hold_s=2.0, floor_items=64, clock=lambda: now[0]), now


def test_an_idle_lane_claims_up_to_its_floor_in_packages_of_its_usual_size() -> None:
    a, _ = make()
    assert a.packages(256) == 2  # 64 items at the default 32 per package
    bulk = Admission(20.0, hold_s=2.0, floor_items=256, package_items=256)
    assert bulk.packages(256) == 1  # one bulk chunk of 256, not 8 taken for 32 each
    bulk.claimed("c1")
    bulk.started("c1", 100)  # the first one seen sets the estimate
    assert bulk.packages(256) == 1  # 156 items of room: one more of about 100


def test_the_limit_follows_the_measured_service_rate() -> None:
    a, now = make()
    for i in range(10):  # one package of 32 items finished every 0.1 s: 320 items/s
        a.claimed(f"p{i}")
        a.started(f"p{i}", 32)
        now[0] += 0.1
        a.finished(f"p{i}", 32)
    assert 300 <= a.rate <= 340
    assert 600 <= a.limit_items <= 680  # rate × 2 s of hold
    assert 18 <= a.packages(256) <= 21
    assert a.packages(5) == 5  # never more than the free slots


def test_held_work_counts_against_the_limit_until_it_leaves() -> None:
    a, _ = make()
    a.claimed("p1")
    a.claimed("p2")
    assert a.packages(256) == 0  # 64 items held: the floor
    a.started("p1", 10)  # smaller than estimated: room for one more estimate
    assert a.held_items == 42
    a.forget("p2")  # dropped without a report (the task ended): its hold goes too
    a.finished("p1", 10)
    assert a.held_items == 0 and a.packages(256) >= 1


def test_a_lane_that_stalls_still_takes_one_package() -> None:
    a, now = make()
    now[0] += 60  # nothing finished for a minute: the rate is 0
    assert a.rate == 0 and a.packages(256) >= 1


def test_the_hold_never_exceeds_half_the_time_limit() -> None:
    assert Admission(3.0, hold_s=2.0).hold_s == 1.5


def test_a_backend_that_slows_down_is_held_less_within_seconds() -> None:
    """Results at 320 items/s, then at a fifth of that: 2 s later the hold has shrunk below
    the floor, to about 2 s of the new rate (one package at least)."""
    a, now = make()
    a.claimed("p")
    a.started("p", 32)
    for _ in range(50):  # 5 s of batches of 32 every 0.1 s
        now[0] += 0.1
        a.progress("p", 32)
    assert 600 <= a.limit_items <= 680
    for _ in range(5):  # the next 5 s: batches of 32 every 0.5 s
        now[0] += 0.5
        a.progress("p", 32)
    assert a.rate < 100 and a.limit_items < a.floor_items * 3
    now[0] += 2.0
    a.progress("p", 32)
    assert a.limit_items <= 2 * 64 + 32


def test_results_counted_as_they_come_back_are_not_counted_again_at_the_end() -> None:
    a, now = make()
    a.claimed("p")
    a.started("p", 64)
    now[0] += 0.1
    a.progress("p", 32)
    now[0] += 0.1
    a.finished("p", 64)  # 32 more at the end
    assert sum(n for _, n in a._done) == 64


def test_a_crawling_backend_is_not_handed_a_floor_it_cannot_finish() -> None:
    """5 s time limit, results at 8 items/s: the 64-item floor would take 8 s; held instead is
    what finishes within the limit, and never less than one package."""
    a, now = make(time_limit_s=5.0)
    a.claimed("p")
    a.started("p", 8)
    for _ in range(10):
        now[0] += 1.0
        a.progress("p", 8)
    assert 7 <= a.rate <= 9
    # 8 items/s × 5 s = 40 (or one package, if larger): not the floor of 64.
    assert a.limit_items == max(40, round(a._package_items)) < 64


def test_a_backend_slower_than_one_batch_a_second_is_not_read_as_stalled_between_batches() -> None:
    """64 items every 1.5 s (≈ 43 items/s): at every moment between two answers the hold stays
    at what the rate finishes within the 5 s limit, never one package (half-empty batches)."""
    a, now = make(time_limit_s=5.0)
    a.floor_items = 256
    a.claimed("p")
    a.started("p", 32)
    for _ in range(8):
        now[0] += 1.5
        a.progress("p", 64)
    for _ in range(15):  # sampled through the next interval
        now[0] += 0.1
        assert 30 <= a.rate <= 50
        assert a.limit_items >= 150
    now[0] += 10.0  # and a real stall still shows
    assert a.rate == 0


def test_a_lane_busy_again_after_idling_starts_from_its_floor() -> None:
    a, now = make()
    a.claimed("p")
    a.started("p", 32)
    now[0] += 0.5
    a.finished("p", 32)
    now[0] += 30.0  # idle
    assert a.packages(256) == 2  # the 64-item floor again, not one package at the stale rate
