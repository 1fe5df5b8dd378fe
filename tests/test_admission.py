"""Admission: a worker holds only the work its lane finishes in a short hold (2 s here)."""

from __future__ import annotations

from workers.queue import Admission


def make(time_limit_s: float = 20.0) -> tuple[Admission, list[float]]:
    now = [100.0]
    return Admission(time_limit_s, hold_s=2.0, floor_items=64, clock=lambda: now[0]), now


def test_an_idle_lane_claims_up_to_its_floor() -> None:
    a, _ = make()
    assert a.packages(256) == 2  # 64 items at the default 32 per package


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
