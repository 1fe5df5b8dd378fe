"""SameTick: calls made together for one key share one backend call; a lone call waits for nothing."""

from __future__ import annotations

import asyncio

import pytest

from producer.api.ticks import SameTick


class Calls:
    def __init__(self, fail: bool = False) -> None:
        self.made: list[tuple[str, list[int]]] = []
        self.fail = fail

    async def __call__(self, key: str, args: list[int]) -> list[int]:
        self.made.append((key, list(args)))
        if self.fail:
            raise ConnectionError("redis down")
        return [a * 10 for a in args]


async def test_concurrent_calls_share_one_call_per_key() -> None:
    calls = Calls()
    same = SameTick(calls)
    results = await asyncio.gather(*(same("a", i) for i in range(5)), same("b", 7))
    assert results == [0, 10, 20, 30, 40, 70]
    assert sorted(calls.made) == [("a", [0, 1, 2, 3, 4]), ("b", [7])]


async def test_calls_in_turn_are_not_held_back() -> None:
    calls = Calls()
    same = SameTick(calls)
    assert [await same("a", i) for i in range(3)] == [0, 10, 20]
    assert calls.made == [("a", [0]), ("a", [1]), ("a", [2])]


async def test_a_failed_call_reaches_every_caller() -> None:
    same = SameTick(Calls(fail=True))
    outcomes = await asyncio.gather(*(same("a", i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(o, ConnectionError) for o in outcomes)
    with pytest.raises(ConnectionError):
        await same("a", 9)
