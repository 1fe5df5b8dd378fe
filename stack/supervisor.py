"""Keep the embedded stack's processes running: reap them, restart them, give up on a crash loop.

A :class:`Supervisor` polls its children (``poll`` reaps, so no zombie is left). A child that
exits is restarted from the same command line (same ports, same data directory) after a
backoff that doubles from ``backoff_s`` to ``backoff_max_s`` and starts again from
``backoff_s`` once the child has stayed up ``stable_s``. A child needing more than
``max_restarts`` restarts within ``window_s`` raises :class:`CrashLoop`. Every start, death,
restart and return to readiness is one structlog line.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from producer.contract import get_logger

from .processes import ManagedProcess, StartError

log = get_logger("stack.supervisor")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    stable_s: float = 60.0  # up this long: the next crash is restarted after backoff_s again
    max_restarts: int = 5  # restarts allowed within window_s; one more crash gives up
    window_s: float = 300.0


class CrashLoop(StartError):
    """A child kept crashing; the message names it, how it last died and its log file."""


def describe_exit(code: int) -> dict[str, int | str]:
    """``{"signal": "SIGSEGV"}`` for a process killed by a signal, else ``{"exit_code": n}``."""
    if code < 0:
        try:
            return {"signal": signal.Signals(-code).name}
        except ValueError:
            return {"signal": str(-code)}
    return {"exit_code": code}


@dataclass
class _Child:
    name: str
    process: ManagedProcess
    delay_s: float
    restarts: deque[float] = field(default_factory=deque)  # when it was restarted, within the window
    restart_at: float | None = None  # set while it is down
    awaiting_ready: bool = False


class Supervisor:
    def __init__(self, policy: RestartPolicy | None = None, *, interval_s: float = 0.2) -> None:
        self.policy = policy or RestartPolicy()
        self.interval_s = interval_s
        self._children: list[_Child] = []

    def watch(self, name: str, process: ManagedProcess) -> None:
        """Supervise an already started process."""
        self._children.append(_Child(name, process, self.policy.backoff_s))
        log.info("child started", child=name, pid=process.pid)

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Check every ``interval_s`` until ``stop()`` is true; raises :class:`CrashLoop`."""
        while not stop():
            self.check()
            time.sleep(self.interval_s)

    def check(self) -> None:
        """One pass: reap and schedule the dead, restart those whose backoff is over."""
        now = time.monotonic()
        for child in self._children:
            if child.restart_at is None:
                code = child.process.poll()
                if code is None:
                    self._check_ready(child, now)
                    continue
                self._died(child, code, now)
            if child.restart_at is not None and now >= child.restart_at:
                self._restart(child, now)

    def _died(self, child: _Child, code: int, now: float) -> None:
        child.process.kill_group()  # helpers of a crashed process would hold on to its resources
        p = self.policy
        uptime = now - child.process.started_at
        if uptime >= p.stable_s:
            child.delay_s = p.backoff_s
        while child.restarts and now - child.restarts[0] > p.window_s:
            child.restarts.popleft()
        how = describe_exit(code)
        if len(child.restarts) >= p.max_restarts:
            log.error(
                "crash loop",
                child=child.name,
                pid=child.process.pid,
                restarts=len(child.restarts),
                window_s=p.window_s,
                **how,
            )
            last = ", ".join(f"{k} {v}" for k, v in how.items())
            raise CrashLoop(
                f"{child.name} crashed again after {len(child.restarts)} restarts within {p.window_s:g}s "
                f"(last: {last}); giving up; see {child.process.log_path}"
            )
        child.restart_at = now + child.delay_s
        log.warning(
            "child exited",
            child=child.name,
            pid=child.process.pid,
            uptime_s=round(uptime, 1),
            restart_in_s=child.delay_s,
            **how,
        )
        child.delay_s = min(child.delay_s * 2, p.backoff_max_s)

    def _restart(self, child: _Child, now: float) -> None:
        try:
            child.process.start(wait=False)  # readiness is checked on later passes, not waited for
        except OSError as exc:
            raise CrashLoop(f"{child.name} could not be started again: {exc}") from exc
        child.restarts.append(now)
        child.restart_at = None
        child.awaiting_ready = child.process.has_probe
        log.info("child restarted", child=child.name, pid=child.process.pid, restarts=len(child.restarts))

    def _check_ready(self, child: _Child, now: float) -> None:
        if child.awaiting_ready and child.process.ready_now():
            child.awaiting_ready = False
            log.info(
                "child ready",
                child=child.name,
                pid=child.process.pid,
                after_s=round(now - child.process.started_at, 1),
            )


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP stop the process as Ctrl-C does (KeyboardInterrupt), so the children are
    stopped on the way out. Once stopping has begun, further signals are ignored: interrupting it
    would leave children behind."""

    def handler(signum: int, _frame: object) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
