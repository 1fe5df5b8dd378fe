"""BatchStore: where a batch lives — its Redis hash and line list, its files, its transition
script. The engine drives batches through it and the output writer reads and finishes them
through it, so neither needs the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..contract import Keys
from .files import FileStore
from .lines import Entry
from .state import LUA_TRANSITION, BatchSettings, BatchState


@dataclass(eq=False)
class BatchStore:
    redis: Any
    keys: Keys
    files: FileStore
    transition: Any  # the registered LUA_TRANSITION script: (from status, fields) → applied?

    @classmethod
    def for_settings(cls, redis: Any, keys: Keys, settings: BatchSettings) -> BatchStore:
        files = FileStore.for_settings(redis, keys, settings)
        return cls(redis, keys, files, redis.register_script(LUA_TRANSITION))

    async def load(self, batch_id: str) -> BatchState | None:
        raw = await self.redis.hgetall(self.keys.batch(batch_id))
        return BatchState.model_validate(raw) if raw else None

    async def entries(self, batch_id: str, start: int, stop: int) -> list[Entry]:
        raw: list[str] = await self.redis.lrange(self.keys.batch_lines(batch_id), start, stop - 1)
        return [Entry.decode(r) for r in raw]
