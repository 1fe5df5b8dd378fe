"""Admission: a worker claims only the work it can finish within the package time limit.

Without it a worker claims up to ``max_jobs`` packages at once. Under a deep backlog that is
far more than its model serves before the time limit, so claimed packages wait in the
batchers, time out, are split and re-queued, and the work done for them is thrown away.

:class:`Admission` measures the items a lane finishes per second while it is busy — counted
as results come back, batch by batch, so a slowdown shows within a batch or two — and holds
at most ``rate × hold_s`` items (``hold_s`` at most half the time limit); the rest stay in
Redis for this worker's next poll or another worker. It holds at least ``floor_items`` — but
only as many as the measured rate finishes within the time limit (never less than one
package), so a backend that slowed to a crawl is not handed a floor it cannot finish.
A short hold is enough to keep the batches full, keeps claimed work from waiting, and bounds
what a killed worker takes down with it. One per lane and process.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

RATE_WINDOW_S = 5.0  # completions counted for the service rate
FAST_WINDOW_S = 1.0  # ... and the last second of them, which a slowdown shows in first
FAST_RESULTS = 4  # ... stretched back over this many results, for backends slower than 1 batch/s
RATE_FRESH_S = 0.05  # a rate this recent is reused: a worker polls far more often than that
IDLE_S = 1.0  # a lane with nothing held and nothing finished for this long was idle


class Admission:
    """Held work of one lane, by package id: claimed (an estimate), then started (its items)."""

    def __init__(
        self,
        time_limit_s: float,
        *,
        hold_s: float = 2.0,
        floor_items: int = 256,
        package_items: float = 32.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.time_limit_s = time_limit_s
        self.hold_s = min(hold_s, time_limit_s / 2)
        self.floor_items = floor_items
        self._clock = clock
        self._held: dict[str, int] = {}
        self.held_items = 0
        # Items per package: the lane's usual size until one is seen (a bulk lane estimated at 32
        # took 8 chunks of 256, 2 048 items, at once when idle), then a moving average.
        self._package_items = package_items
        self._sized = False
        self._done: deque[tuple[float, int]] = deque()  # (when, items) finished in the window
        self._done_items = 0  # their sum
        self._last: deque[tuple[float, int]] = deque(maxlen=FAST_RESULTS)  # the last few, however old
        # The last second's results and their sum, kept as they come: a refresh reads the sum, not
        # the results (a walk over them was 3 % of an interactive worker's CPU).
        self._second: deque[tuple[float, int]] = deque()
        self._second_items = 0
        self._reported: dict[str, int] = {}  # package → items already counted by progress()
        self._busy_since = clock()
        self._rate: tuple[float, float] | None = None  # (when computed, items/s)

    @property
    def rate(self) -> float:
        """Items finished per second since the lane got busy: the lower of the last window's
        rate and the recent one, so a slowdown counts within a second or two and a speed-up
        only once it lasts."""
        now = self._clock()
        if self._rate is not None and now - self._rate[0] < RATE_FRESH_S:
            return self._rate[1]
        rate = self._measure(now)
        self._rate = (now, rate)
        return rate

    def _measure(self, now: float) -> float:
        start = max(now - RATE_WINDOW_S, self._busy_since)
        while self._done and self._done[0][0] < start:
            self._done_items -= self._done.popleft()[1]
        slow = self._done_items / max(now - start, 0.25)
        if now - start < FAST_WINDOW_S:  # busy for less than a second: one window is all there is
            return slow
        return min(slow, self._recent_rate(now))

    def _recent_rate(self, now: float) -> float:
        """Items/s over the last second, stretched back to the last ``FAST_RESULTS`` results: a
        backend answering once every 1.5 s must not read as stalled between two answers (it
        did, and the hold fell to one package: half-empty batches). The silence since the last
        result counts only where it is longer than the results' usual interval."""
        begin = max(now - FAST_WINDOW_S, self._busy_since)
        second = self._second
        while second and second[0][0] <= begin:
            self._second_items -= second.popleft()[1]
        items, results = self._second_items, len(second)
        if len(self._last) == FAST_RESULTS and self._last[0][0] < now - FAST_WINDOW_S:
            begin = max(self._last[0][0], self._busy_since)  # fewer than that in the last second
            items = results = 0
            for when, n in self._last:
                if when > begin:
                    items += n
                    results += 1
        if not results:
            return 0.0
        span = self._last[-1][0] - begin
        interval = span / results
        return items / max(span, now - begin - interval, 1e-3)

    @property
    def limit_items(self) -> int:
        if self._idle():  # no result yet in this busy period: no rate to go by
            return self.floor_items
        rate = self.rate
        # The floor only as far as the measured rate finishes it within the time limit: below
        # that the backend's pipeline runs on partial batches (a slower backend needs as many
        # items in flight to stay busy), above it claimed work would wait past the limit.
        floor = min(self.floor_items, int(rate * self.time_limit_s))
        return max(round(self._package_items), floor, int(rate * self.hold_s))

    def packages(self, free_slots: int) -> int:
        """How many more packages to claim now (at most ``free_slots``; one if none is held)."""
        room = self.limit_items - self.held_items
        fit = int(room // self._package_items) if room > 0 else 0
        return min(free_slots, fit if self._held else max(fit, 1))

    def claimed(self, package_id: str) -> None:
        if self._idle():
            self._busy_since = self._clock()  # idle time must not dilute the measured rate
            self._done.clear()  # nor results from before it
            self._last.clear()
            self._second.clear()
            self._second_items = 0
            self._done_items = 0
            self._rate = None
        self._set(package_id, round(self._package_items))

    def started(self, package_id: str, items: int) -> None:
        """The package's real size, known once its payload is decoded."""
        self._set(package_id, items)
        if not self._sized:
            self._package_items, self._sized = float(max(items, 1)), True
        else:
            self._package_items += 0.2 * (max(items, 1) - self._package_items)

    def progress(self, package_id: str, items: int) -> None:
        """``items`` of the package's jobs came back (a batch's results, before the package ends)."""
        self._reported[package_id] = self._reported.get(package_id, 0) + items
        self._record(items)

    def finished(self, package_id: str, terminal_items: int) -> None:
        """The package's run ended with ``terminal_items`` of its jobs terminal."""
        reported = self._reported.get(package_id, 0)
        self.forget(package_id)
        if terminal_items > reported:  # those not already counted as they came back
            self._record(terminal_items - reported)

    def forget(self, package_id: str) -> None:
        self.held_items -= self._held.pop(package_id, 0)
        self._reported.pop(package_id, None)

    def _record(self, items: int) -> None:
        entry = (self._clock(), items)
        self._done.append(entry)
        self._done_items += items
        self._last.append(entry)
        self._second.append(entry)
        self._second_items += items

    def _idle(self) -> bool:
        """Nothing held, and no result for ``IDLE_S`` (or ever)."""
        if not self._last:
            return True
        return not self._held and self._clock() - self._last[-1][0] > IDLE_S

    def _set(self, package_id: str, items: int) -> None:
        self.held_items += items - self._held.get(package_id, 0)
        self._held[package_id] = items
