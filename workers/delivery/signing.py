"""Standard Webhooks v1 signatures, and the tenants' webhook secrets they are made with.

``webhook-signature`` holds one ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` entry
per active secret, so receivers keep verifying while a secret is rotated.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from pathlib import Path

from producer.contract import TenantSpec, load_tenants, webhook_secret_bytes

from ..core.watched import WatchedFile


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """One Standard Webhooks ``v1`` signature entry."""
    content = f"{msg_id}.{timestamp}.{body}".encode()
    mac = hmac.new(webhook_secret_bytes(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signature_header(secrets: Sequence[str], msg_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` value: one entry per active secret, space-separated."""
    return " ".join(sign(s, msg_id, timestamp, body) for s in secrets)


class TenantSecrets:
    """Webhook secrets from the tenants file, re-read when the file changes (a bad version
    keeps the secrets already loaded)."""

    def __init__(self, path: Path | None) -> None:
        self._file = WatchedFile(path, load_tenants, "tenants", interval_s=0.0) if path else None
        self._tenants: dict[str, TenantSpec] = {}

    def secrets(self, tenant: str, secret_id: str | None) -> list[str]:
        if self._file is not None and (tenants := self._file.poll()) is not None:
            self._tenants = tenants
        spec = self._tenants.get(tenant)
        return spec.secrets_for(secret_id) if spec else []
