"""Tenants' monthly remote budgets: past its budget, a tenant's jobs stop spilling.

A budget is ``monthly_remote_budget`` (dollars) in the tenants file (re-read when it changes).
What a tenant spent on remotes this month is the ledger's running total in Redis (every
worker adds to it), read once per ``refresh_s``, plus what this worker booked and has not
flushed yet. Over budget, a job that could spill runs locally (``route_reason:
budget_exceeded``) and a job for a remote-only model fails (``error.type: budget_exceeded``).
The check is as fresh as the last refresh, so a burst may pass a budget by a few jobs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import Keys, TenantSpec, get_logger, load_tenants, month_of

from ..core.periodic import Periodic
from ..core.watched import WatchedFile
from .ledger import Ledger

log = get_logger(__name__)


class BudgetConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="forbid")

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
        path = self.config.tenants_file
        # Checked on every refresh (which keeps its own pace); a bad version keeps the budgets.
        self._file = WatchedFile(path, load_tenants, "tenants", interval_s=0) if path is not None else None
        self._task = Periodic("budget refresh", self.refresh, lambda: self.config.budget_refresh_s)

    def start(self) -> None:
        if self.config.tenants_file is not None:
            self._task.start()

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
        tenants: dict[str, TenantSpec] | None = self._file.poll() if self._file is not None else None
        if tenants is None:
            return
        self._budgets = {
            name: spec.monthly_remote_budget
            for name, spec in tenants.items()
            if spec.monthly_remote_budget is not None
        }

    async def aclose(self) -> None:
        await self._task.aclose()
