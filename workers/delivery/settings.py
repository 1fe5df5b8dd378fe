"""WebhookSettings: how the worker delivers callbacks (timeouts, retries, allow-list, fairness)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .ssrf import parse_allow_entry

DEFAULT_SCHEDULE_S = [5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0]


class WebhookSettings(BaseSettings):
    """Webhook delivery settings, from ``OVERSPILL_*`` like the rest of the worker.

    Lists accept JSON or comma-separated values:
    ``OVERSPILL_WEBHOOK_ALLOW_HOSTS=127.0.0.1:8080,10.1.0.0/16:443,[fd00::/8]:9000`` (an entry
    without a port admits ports 80 and 443 only).
    """

    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="forbid")

    tenants_file: Path | None = None
    webhook_timeout_s: float = 5.0  # a receiver slower than this holds a slot for nothing
    webhook_retry_schedule_s: Annotated[list[float], NoDecode] = DEFAULT_SCHEDULE_S
    webhook_jitter: float = 0.1  # a retry waits up to this fraction longer
    webhook_max_retry_after_s: float = 24 * 3600.0
    webhook_allow_hosts: Annotated[list[str], NoDecode] = []
    webhook_max_jobs: int = 64  # delivery slots of this worker, all tenants together
    webhook_tenant_max_inflight: int = 8  # slots one tenant may hold; below webhook_max_jobs
    webhook_poll_delay_s: float = 0.05  # the outbox is also looked at this often (a lost wake-up)
    # A claimed delivery's lease, renewed while its worker holds it: a killed worker's deliveries
    # go out again from another this long after its last renewal. Above the timeout.
    webhook_lease_s: float = 30.0
    webhook_state_ttl_s: int = 7 * 24 * 3600
    webhook_dead_letter_ttl_s: int = 7 * 24 * 3600
    webhook_dead_letter_max: int = 1000  # per tenant; the oldest are dropped
    webhook_dead_letter_body_max_bytes: int = 16 * 1024  # larger bodies stay in the job record only

    @field_validator("webhook_retry_schedule_s", "webhook_allow_hosts", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("["):
                return json.loads(v)
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

    @field_validator("webhook_allow_hosts")
    @classmethod
    def _entries(cls, v: list[str]) -> list[str]:
        for entry in v:
            parse_allow_entry(entry)  # a typo must stop the worker, not open or close a port
        return v

    @model_validator(mode="after")
    def _lease(self) -> WebhookSettings:
        if self.webhook_lease_s <= self.webhook_timeout_s:
            raise ValueError("webhook_lease_s must exceed webhook_timeout_s: a lease may not end mid-POST")
        return self

    @model_validator(mode="after")
    def _tenant_cap(self) -> WebhookSettings:
        if not 0 < self.webhook_tenant_max_inflight < self.webhook_max_jobs:
            raise ValueError(
                "webhook_tenant_max_inflight must be at least 1 and below webhook_max_jobs "
                f"({self.webhook_max_jobs}), so that one tenant cannot take every delivery slot"
            )
        return self
