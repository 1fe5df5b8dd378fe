"""The worker process's one settings root: read from ``OVERSPILL_*`` once, in ``main()``, and
passed down; no room below reads the environment itself.

Every variable keeps its name: each sub-settings class has its own prefix (``OVERSPILL_``,
``OVERSPILL_REMOTE_``, ``OVERSPILL_CACHE_``, ...), and an unknown keyword is an error.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..core.settings import WorkerConfig
from ..delivery.settings import WebhookSettings
from ..dispatch.settings import DispatchSettings


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    dispatch: DispatchSettings = Field(default_factory=DispatchSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)

    @classmethod
    def from_env(cls) -> Settings:
        """Read every sub-settings from the environment (a bad value fails here, naming it)."""
        return cls()
