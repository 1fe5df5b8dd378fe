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
from collections.abc import Iterable, Iterator
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
