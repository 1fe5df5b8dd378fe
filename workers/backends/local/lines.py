"""The micro-batcher's queue of one priority: each tenant's items in a line of their own, and
the lines in turn, one backend request each.

A worker holds packages of several tenants at once (the lanes' fair share decides which it
claims, docs/scheduling.md). Without lines, a small tenant's items would queue behind every
item of a big tenant's packages already held; with them, its items ride in the next request.
Within a line, items keep their order. The queue answers what the batcher asks of a deque:
its length, its head, ``popleft``, ``extend``, ``extendleft``, iteration and ``clear``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol


class Grouped(Protocol):
    group: str


class Lines:
    def __init__(self) -> None:
        self._lines: dict[str, deque[Any]] = {}
        self._turns: deque[str] = deque()  # groups with items; the first one is served now
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[Any]:
        for group in self._turns:
            yield from self._lines[group]

    def __getitem__(self, index: int) -> Any:
        if index != 0 or not self._size:
            raise IndexError("only the head of the queue is read")
        return self._lines[self._turns[0]][0]

    def extend(self, items: Iterable[Grouped]) -> None:
        for item in items:
            self._line(item.group, first=False).append(item)
            self._size += 1

    def extendleft(self, items: Iterable[Grouped]) -> None:
        """Put items back at the front of their lines (as ``deque.extendleft``: the last one
        given ends up first); a line that had emptied is served first again."""
        for item in items:
            self._line(item.group, first=True).appendleft(item)
            self._size += 1

    def _line(self, group: str, *, first: bool) -> deque[Any]:
        line = self._lines.get(group)
        if line is None:
            line = self._lines[group] = deque()
            if first:
                self._turns.appendleft(group)
            else:
                self._turns.append(group)
        return line

    def popleft(self) -> Any:
        group = self._turns[0]
        line = self._lines[group]
        item = line.popleft()
        self._size -= 1
        if not line:
            del self._lines[group]
            self._turns.popleft()
        return item

    def turn(self) -> None:
        """The line served now goes to the back: the next request starts with the next one."""
        if len(self._turns) > 1:
            self._turns.rotate(-1)

    def clear(self) -> None:
        self._lines.clear()
        self._turns.clear()
        self._size = 0


def pick_similar(costs: Sequence[int], rows: int, budget: int | None) -> list[int]:
    """Indices of at most ``rows`` items, item 0 among them, nearest item 0's cost, whose
    padded size (rows × the longest) stays within ``budget``."""
    order = sorted(range(len(costs)), key=costs.__getitem__)
    lo = hi = order.index(0)
    anchor = longest = costs[0]
    while hi - lo + 1 < rows:
        left = order[lo - 1] if lo > 0 else None
        right = order[hi + 1] if hi + 1 < len(order) else None
        if left is None and right is None:
            break
        fits_right = right is not None and fits(hi - lo + 2, max(longest, costs[right]), budget)
        take_right = fits_right and (left is None or costs[right] - anchor < anchor - costs[left])
        if take_right:
            hi += 1
            longest = max(longest, costs[right])  # type: ignore[index]
        elif left is not None and fits(hi - lo + 2, longest, budget):
            lo -= 1
        else:
            break
    return order[lo : hi + 1]


def fits(rows: int, longest: int, budget: int | None) -> bool:
    """Whether ``rows`` padded to ``longest`` stay within the token budget (none: always)."""
    return not budget or rows * longest <= budget
