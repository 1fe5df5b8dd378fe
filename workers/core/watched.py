"""THE file watcher: a file re-read when it changes (the remote's API key, tenants' webhook
secrets, prices, budgets, the routing policy); a bad version keeps the values in force.

:class:`WatchedFile` reads its file at most once per ``interval_s`` (a small file: cheap enough
for a hot path), loads it only when its bytes changed (not its mtime, which two writes in one
clock tick share; a ConfigMap is swapped atomically, so a read sees the old file or the new
one) and hands back the new value. A file that cannot
be read or does not load changes nothing: the error is logged once per version of the file and
``overspill_config_file_errors_total{file}`` counts it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from producer.contract import get_logger

from .metrics import FILE_ERRORS

log = get_logger(__name__)

T = TypeVar("T")
_MISSING = b"missing"  # never a SHA-256 digest


class WatchedFile(Generic[T]):
    def __init__(self, path: Path, load: Callable[[Path], T], what: str, *, interval_s: float = 1.0) -> None:
        """``load`` raises ``ValueError`` (or a subclass) for a file it refuses. ``interval_s`` 0
        reads the file on every poll (a small secret file, where a rotation must be seen at once)."""
        self.path = path
        self._load = load
        self.what = what
        self.interval_s = interval_s
        self._stamp: bytes | None = None  # the digest of the version last seen, good or bad
        self._next = 0.0

    def prime(self) -> None:
        """Take the file as it is now for loaded already (its first version was read at start)."""
        self._stamp = self._digest() or _MISSING

    def _digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None

    def poll(self) -> T | None:
        """The file's new value when it changed and loads; None otherwise."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.interval_s
        stamp = self._digest()
        if stamp is None:
            if self._stamp != _MISSING:
                self._stamp = _MISSING
                self._refuse(f"{self.path}: cannot read it")
            return None
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            value = self._load(self.path)
        except (ValueError, OSError) as exc:  # OSError: the file went between the read and the load
            self._refuse(str(exc))
            return None
        log.info("file re-read", file=str(self.path), what=self.what)
        return value

    def _refuse(self, error: str) -> None:
        log.error(
            f"{self.what} file refused; the values in force stay", file=str(self.path), error=error[:300]
        )
        FILE_ERRORS.labels(self.what).inc()
