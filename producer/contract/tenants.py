"""The tenants file: API keys (hashed) to tenants, webhook secrets, limits."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# The tenants file (``OVERSPILL_TENANTS_FILE``) is read by both sides: the API maps API keys
# to tenants and enforces their limits; workers sign each tenant's webhooks with its secrets.
# API keys are stored only as SHA-256 hex digests; webhook secrets must be stored as they are
# (an HMAC needs the key), so the file is a secret and is mounted like one.

WEBHOOK_SECRET_PREFIX = "whsec_"


class TenantSpec(BaseModel):
    """One tenant: its API keys (hashed), webhook secrets and limits."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")
    api_key_sha256: list[str] = Field(default_factory=list)
    # secret id → secrets that sign at the same time (more than one while rotating).
    webhook_secrets: dict[str, list[str]] = Field(default_factory=dict)
    max_queued: int = Field(default=10_000, ge=1)
    max_streams: int = Field(default=32, ge=1)  # SSE responses open at once (streamed chat, job events)
    rate_per_s: float = Field(default=50.0, gt=0)  # token bucket refill
    burst: int = Field(default=100, ge=1)  # token bucket size
    max_file_bytes_total: int = Field(default=10 * 1024**3, ge=0)  # bytes of /v1/files kept at once
    admin: bool = False  # its key reads every tenant's usage (GET /v1/usage)
    # Fair share of each lane (docs/scheduling.md): its weight against other tenants' work, and
    # a cap on its items in flight (None: none), so it cannot hold every worker slot alone.
    share: float = Field(default=1.0, gt=0, le=1e6)
    max_in_flight: int | None = Field(default=None, ge=1)
    # Dollars a month it may spend on remotes; past it, jobs stop spilling. None: no budget.
    monthly_remote_budget: float | None = Field(default=None, ge=0)

    @field_validator("api_key_sha256")
    @classmethod
    def _hex_digests(cls, v: list[str]) -> list[str]:
        for digest in v:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("api_key_sha256 holds lowercase SHA-256 hex digests, not keys")
        return v

    @field_validator("webhook_secrets")
    @classmethod
    def _secrets(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for secret_id, values in v.items():
            for value in values:
                raw = webhook_secret_bytes(value)
                if not 24 <= len(raw) <= 64:
                    raise ValueError(f"webhook secret {secret_id!r} must decode to 24-64 bytes")
        return v

    def secrets_for(self, secret_id: str | None) -> list[str]:
        return list(self.webhook_secrets.get(secret_id or "default", []))


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: list[TenantSpec]

    @model_validator(mode="after")
    def _unique(self) -> TenantsFile:
        names = [t.name for t in self.tenants]
        if len(names) != len(set(names)):
            raise ValueError("tenant names must be unique")
        digests = [d for t in self.tenants for d in t.api_key_sha256]
        if len(digests) != len(set(digests)):
            raise ValueError("an API key belongs to one tenant only")
        return self


def webhook_secret_bytes(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (Standard Webhooks)."""
    if not secret.startswith(WEBHOOK_SECRET_PREFIX):
        raise ValueError("webhook secrets start with 'whsec_'")
    try:
        return base64.b64decode(secret.removeprefix(WEBHOOK_SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from None


def load_tenants(path: str | Path) -> dict[str, TenantSpec]:
    """Read a tenants JSON file; raise ``ValueError`` naming the problem."""
    try:
        data = json.loads(Path(path).read_text())
        return {t.name: t for t in TenantsFile.model_validate(data).tenants}
    except (OSError, json.JSONDecodeError, ValidationError) as exc:
        raise ValueError(f"tenants file {path}: {exc}") from None


def new_api_key() -> str:
    return "osk_" + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
