"""Tenants' monthly remote budgets: past its budget, a tenant's jobs stop spilling.

A budget is ``monthly_remote_budget`` (dollars) in the tenants file (re-read when it changes).
What a tenant spent on remotes this month is the ledger's running total in Redis (every
worker adds to it), read once per ``refresh_s``, plus what this worker booked and has not
flushed yet. Over budget, a job that could spill runs locally (``route_reason:
budget_exceeded``) and a job for a remote-only model fails (``error.type: budget_exceeded``).
The check is as fresh as the last refresh, so a burst may pass a budget by a few jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import Keys, TenantSpec, get_logger, load_tenants, month_of

from .ledger import Ledger

log = get_logger(__name__)


class BudgetConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="ignore")

    tenants_file: Path | None = None
    budget_refresh_s: float = Field(default=1.0, gt=0)


class Budgets:
    def __init__(self, redis: Any, keys: Keys, ledger: Ledger, config: BudgetConfig | None = None) -> None:
        self.config = config or BudgetConfig()
        self._redis = redis
        self._keys = keys
        self._ledger = ledger
        self._budgets: dict[str, float] = {}
        self._spent: dict[str, float] = {}
        self._mtime: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and self.config.tenants_file is not None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="budgets")

    def exceeded(self, tenant: str) -> bool:
        budget = self._budgets.get(tenant)
        if budget is None:
            return False
        return self._spent.get(tenant, 0.0) + self._ledger.unflushed_spend(tenant) >= budget

    def spent(self, tenant: str) -> float:
        return self._spent.get(tenant, 0.0) + self._ledger.unflushed_spend(tenant)

    def budget(self, tenant: str) -> float | None:
        return self._budgets.get(tenant)

    async def refresh(self) -> None:
        self._reload()
        if not self._budgets:
            return
        names = sorted(self._budgets)
        values = await self._redis.hmget(self._keys.remote_spend(month_of(time.time())), names)
        self._spent = {name: float(v) for name, v in zip(names, values, strict=True) if v is not None}

    def _reload(self) -> None:
        path = self.config.tenants_file
        assert path is not None
        try:
            mtime = os.stat(path).st_mtime
        except OSError as exc:
            log.error("tenants file unreadable; budgets unchanged", error=str(exc))
            return
        if mtime == self._mtime:
            return
        try:
            tenants: dict[str, TenantSpec] = load_tenants(path)
        except ValueError as exc:
            log.error("tenants file invalid; budgets unchanged", error=str(exc)[:300])
            return
        self._mtime = mtime
        self._budgets = {
            name: spec.monthly_remote_budget
            for name, spec in tenants.items()
            if spec.monthly_remote_budget is not None
        }

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # Redis away: keep the last figures
                log.warning("budget refresh failed", error=repr(exc)[:200])
            await asyncio.sleep(self.config.budget_refresh_s)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
