"""Optional result cache in Redis, for deterministic requests only.

Keyed by ``producer.contract.request_fingerprint`` (kind + canonical body), so the same request
from any tenant or job gets the same answer without a backend call. Only requests whose
answer cannot vary are cached: embeddings, rerank, and chat at temperature 0. A cache that
misbehaves is skipped, never a reason to fail a job.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import JobKind, Keys, WorkItem, dumps, get_logger, loads, request_fingerprint

from ..backends.base import Answer
from ..backends.bodies import response_id
from ..core.metrics import CACHE

log = get_logger(__name__)


class CacheConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVERSPILL_CACHE_", extra="forbid")

    enabled: bool = False
    ttl_s: int = Field(default=3600, ge=1)


def cacheable(item: WorkItem) -> bool:
    if item.kind in (JobKind.embed, JobKind.rerank):
        return True
    return item.kind == JobKind.chat and item.body.get("temperature", 1.0) == 0


class ResultCache:
    def __init__(self, redis: Any, keys: Keys, ttl_s: int) -> None:
        self._redis = redis
        self._keys = keys
        self.ttl_s = ttl_s

    def _key(self, item: WorkItem) -> str:
        return self._keys.cache(request_fingerprint(item.kind, item.body))

    async def get(self, item: WorkItem) -> Answer | None:
        if not cacheable(item):
            return None
        try:
            raw = await self._redis.get(self._key(item))
        except Exception as exc:
            log.warning("cache read failed", error=type(exc).__name__)
            return None
        CACHE.labels("hit" if raw else "miss").inc()
        if not raw:
            return None
        entry = loads(raw)
        body: dict[str, Any] = entry["body"]
        if "id" in body:  # the answer is shared, the id is this job's
            body["id"] = response_id(item.kind, item.id)
        return Answer(body, entry["model"])

    async def put(self, item: WorkItem, answer: Answer) -> None:
        if not cacheable(item):
            return
        try:
            entry = dumps({"body": answer.body, "model": answer.model})
            await self._redis.set(self._key(item), entry, ex=self.ttl_s)
        except Exception as exc:
            log.warning("cache write failed", error=type(exc).__name__)
