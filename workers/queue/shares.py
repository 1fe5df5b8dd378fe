"""Tenants' shares and caps, from the tenants file to the hash the fair-share claim reads.

Every worker with a tenants file publishes it (they hold the same file, so the writes agree);
a changed file changes the shares at the next tick, without a restart. The hash is written
again every ``refresh_s`` as well, so a Redis that lost it (a restart without AOF) has it back.
A tenant missing from the hash has share 1 and no cap.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from producer.contract import Keys, TenantSpec, get_logger, load_tenants, share_value

from ..core.periodic import Periodic
from ..core.watched import WatchedFile

log = get_logger(__name__)


def share_map(tenants: dict[str, TenantSpec]) -> dict[str, str]:
    """Tenant → ``share|cap``, only for tenants that differ from the default."""
    return {
        name: share_value(t.share, t.max_in_flight)
        for name, t in tenants.items()
        if t.share != 1.0 or t.max_in_flight is not None
    }


class SharePublisher:
    def __init__(
        self, redis: Any, keys: Keys, path: Path, *, tick_s: float = 1.0, refresh_s: float = 30.0
    ) -> None:
        self._redis = redis
        self._key = keys.shares()
        self._file = WatchedFile(path, load_tenants, "tenants", interval_s=0.0)
        self._refresh_s = refresh_s
        self._shares: dict[str, str] | None = None
        self._written_at = 0.0
        self._task = Periodic("tenant shares", self.step, tick_s)

    def start(self) -> None:
        self._task.start()

    async def aclose(self) -> None:
        await self._task.aclose()

    async def step(self) -> None:
        tenants = self._file.poll()
        changed = False
        if tenants is not None:
            shares = share_map(tenants)
            changed, self._shares = shares != self._shares, shares
        if self._shares is None or not (changed or time.monotonic() - self._written_at > self._refresh_s):
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._key)
            if self._shares:
                pipe.hset(self._key, mapping=self._shares)
            await pipe.execute()
        self._written_at = time.monotonic()
        if changed:
            log.info("tenant shares published", tenants=len(self._shares))
