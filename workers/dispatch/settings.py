"""DispatchSettings: the settings of everything dispatch wires together, one field per room."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..accounting.budgets import BudgetConfig
from ..backends.remote.config import RemoteConfig
from ..backends.remote.providers_file import ProvidersConfig
from ..routing.policy import PolicyConfig
from ..routing.router import RouterConfig
from .cache import CacheConfig


class DispatchSettings(BaseModel):
    """Each field reads its own ``OVERSPILL_*`` variables when the settings root is built."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    router: RouterConfig = Field(default_factory=RouterConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    remote: RemoteConfig = Field(default_factory=RemoteConfig)
    providers: ProvidersConfig = Field(default_factory=ProvidersConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    budgets: BudgetConfig = Field(default_factory=BudgetConfig)
