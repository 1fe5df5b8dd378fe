"""A small circuit breaker, one per backend (Triton, the remote).

After ``failures`` consecutive failures the circuit opens and callers stop sending to that
backend, so jobs fail over at once instead of each paying for a timeout. After
``reset_after_s`` one trial call is let through (half-open); its success closes the circuit,
its failure re-opens it for another period. A trial that never reports back (its job went
elsewhere) is forgotten after another ``reset_after_s``, so the circuit cannot stick.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum

from producer.contract import get_logger

from .metrics import CIRCUIT_OPEN

log = get_logger(__name__)


class CircuitState(StrEnum):
    closed = "closed"
    open = "open"
    half_open = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        failures: int = 3,
        reset_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1 or reset_after_s < 0:
            raise ValueError("failures must be >= 1 and reset_after_s >= 0")
        self.name = name
        self.threshold = failures
        self.reset_after_s = reset_after_s
        self._clock = clock
        self._state = CircuitState.closed
        self._failures = 0
        self._since = clock()  # when the circuit opened, or when the trial was let through
        self._probe_down = False  # the last health probe said the backend is down

    @property
    def state(self) -> CircuitState:
        return self._state

    def would_allow(self) -> bool:
        """What :meth:`allow` would answer, without using up a half-open trial."""
        return self._state == CircuitState.closed or self._clock() - self._since >= self.reset_after_s

    def allow(self) -> bool:
        """May a call go to this backend now? In half-open state, True for one trial call."""
        if self._state == CircuitState.closed:
            return True
        if self._clock() - self._since < self.reset_after_s:
            return False
        self._state = CircuitState.half_open
        self._since = self._clock()
        return True

    def record_success(self) -> None:
        if self._state != CircuitState.closed:
            log.info("circuit closed", backend=self.name)
        self._state = CircuitState.closed
        self._failures = 0
        CIRCUIT_OPEN.labels(self.name).set(0)

    def record_failure(self) -> None:
        self._failures += 1
        if self._state == CircuitState.half_open or self._failures >= self.threshold:
            self.trip()

    def probe(self, ok: bool) -> None:
        """A health probe's answer: down opens the circuit; the first up after a down closes it
        at once (no waiting out ``reset_after_s`` while the backend already answers)."""
        if not ok:
            self.trip()
        elif self._probe_down:
            self.record_success()
        self._probe_down = not ok

    def trip(self) -> None:
        """Open now (a failed probe, or a signal that the backend is down)."""
        if self._state != CircuitState.open:
            log.warning("circuit opened", backend=self.name, failures=self._failures)
        self._state = CircuitState.open
        self._since = self._clock()
        CIRCUIT_OPEN.labels(self.name).set(1)
