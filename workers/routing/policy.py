"""The live routing policy: re-read from a file or a Redis key, applied without a restart.

(The policy file is read whole each refresh, as the Redis key is, rather than through
:class:`workers.core.watched.WatchedFile`: either source may change, and a change of source must
re-apply the policy even when the file itself did not change.)

Every ``policy_refresh_s`` the watcher reads the Redis key ``Keys.policy()`` and, when that is
unset, ``OVERSPILL_POLICY_FILE`` (a mounted ConfigMap is replaced atomically by kubelet, so a
read sees the old or the new file). A new document is validated as a whole
(:class:`producer.contract.RoutingPolicy`) and merged over the worker's ``OVERSPILL_*``
settings; a document that does not parse or validate changes nothing: the old policy stays,
the error is logged and ``overspill_policy_errors_total`` counts it. The policy in force is
exported (``overspill_policy_remote_ratio``, ``overspill_policy_mode``,
``overspill_policy_routing``) and published in Redis
for the API's ``GET /v1/admin/policy``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import (
    Keys,
    PolicyError,
    RoutingPolicy,
    first_error,
    get_logger,
    parse_policy,
    policy_json,
)

from ..core.metrics import POLICY_ERRORS, POLICY_MODE, POLICY_RATIO, POLICY_RELOADS, POLICY_ROUTING
from ..core.periodic import Periodic
from .router import RouterConfig

log = get_logger(__name__)

PUBLISH_TTL_S = 30.0  # a worker's published policy counts as current this long


class PolicyConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="forbid")

    policy_file: Path | None = None
    policy_refresh_s: float = Field(default=1.0, gt=0)


def merged(base: RouterConfig, policy: RoutingPolicy) -> RouterConfig:
    """The router settings with the policy's fields over them (validated as a whole)."""
    try:
        return RouterConfig.model_validate({**base.model_dump(), **policy.settings()})
    except ValidationError as exc:
        raise PolicyError(first_error(exc, top="")) from None


class PolicyWatcher:
    def __init__(
        self,
        redis: Any,
        keys: Keys,
        base: RouterConfig,
        apply: Callable[[RouterConfig, RoutingPolicy], None],
        worker_id: str,
        config: PolicyConfig | None = None,
    ) -> None:
        self.config = config or PolicyConfig()
        self._redis = redis
        self._keys = keys
        self._base = base
        self._apply = apply
        self._worker_id = worker_id
        self._raw: tuple[str, bytes] | None = None  # (source, text) last seen, good or bad
        self.policy = RoutingPolicy()
        self.source = "settings"
        self._published_at = 0.0
        self._task = Periodic("policy refresh", self._tick, lambda: self.config.policy_refresh_s)
        self._export(base)

    def start(self) -> None:
        self._task.start()

    async def _read(self) -> tuple[str, bytes] | None:
        stored = await self._redis.get(self._keys.policy())
        if stored:
            return "redis", stored if isinstance(stored, bytes) else str(stored).encode()
        path = self.config.policy_file
        if path is None:
            return None
        try:
            return str(path), path.read_bytes()
        except OSError as exc:
            if self._raw != (str(path), b""):
                log.error(
                    "policy file unreadable; the policy in force stays", file=str(path), error=exc.strerror
                )
                POLICY_ERRORS.labels("file").inc()
                self._raw = (str(path), b"")
            return self._raw

    async def refresh(self) -> bool:
        """Read the policy; True when a new one was applied."""
        raw = await self._read()
        if raw is None:
            raw = ("settings", b"")
        if raw == self._raw:
            return False
        self._raw = raw
        source, text = raw
        try:
            policy = parse_policy(text, source) if source != "settings" else RoutingPolicy()
            router = merged(self._base, policy)
        except PolicyError as exc:
            log.error(
                "routing policy refused; the policy in force stays", source=source, error=str(exc)[:300]
            )
            POLICY_ERRORS.labels("redis" if source == "redis" else "file").inc()
            return False
        self.policy, self.source = policy, source
        self._apply(router, policy)
        self._export(router)
        POLICY_RELOADS.inc()
        log.info("routing policy applied", source=source, policy=policy_json(policy))
        return True

    def _export(self, router: RouterConfig) -> None:
        POLICY_RATIO.set(router.remote_ratio)
        for mode in ("hybrid", "triton", "remote"):
            POLICY_MODE.labels(mode).set(int(router.gateway_mode == mode))
        for routing in ("overflow", "cost"):
            POLICY_ROUTING.labels(routing).set(int(router.routing == routing))

    async def publish(self) -> None:
        doc = {
            "policy": json.loads(policy_json(self.policy)),
            "source": self.source,
            "until": time.time() + PUBLISH_TTL_S,
        }
        await self._redis.hset(self._keys.policy_effective(), self._worker_id, json.dumps(doc))

    async def _tick(self) -> None:
        """Re-read the policy (Redis away: the policy in force stays), and publish it when it
        changed or its published copy is about to go stale."""
        changed = await self.refresh()
        if changed or time.monotonic() - self._published_at > PUBLISH_TTL_S / 3:
            await self.publish()
            self._published_at = time.monotonic()

    async def aclose(self) -> None:
        await self._task.aclose()


def worker_id() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"
