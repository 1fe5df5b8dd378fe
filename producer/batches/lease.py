"""Lease: one driver at a time steps a batch (a Redis key with a TTL, renewed while it works)."""

from __future__ import annotations

from typing import Any

from ..errors import OverspillError


class LeaseLost(OverspillError):
    """Another driver took over the batch (this one stalled past the lease)."""


class Lease:
    """One driver's exclusive right to step a batch, for ``ttl_s`` unless renewed."""

    def __init__(self, key: str, token: str, ttl_s: float, renew: Any, release: Any) -> None:
        self.key = key
        self.token = token
        self._ttl_ms = int(ttl_s * 1000)
        self._renew = renew  # LUA_RENEW and LUA_RELEASE, registered once by the engine
        self._release = release

    async def renew(self) -> None:
        if not await self._renew(keys=[self.key], args=[self.token, self._ttl_ms]):
            raise LeaseLost(self.key)

    async def release(self) -> None:
        await self._release(keys=[self.key], args=[self.token])
