"""Standard Webhooks v1 signatures, and the tenants' webhook secrets they are made with.

``webhook-signature`` holds one ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` entry
per active secret, so receivers keep verifying while a secret is rotated.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Sequence
from pathlib import Path

from producer.contract import TenantSpec, get_logger, load_tenants, webhook_secret_bytes

log = get_logger("workers.delivery.webhooks")


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """One Standard Webhooks ``v1`` signature entry."""
    content = f"{msg_id}.{timestamp}.{body}".encode()
    mac = hmac.new(webhook_secret_bytes(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signature_header(secrets: Sequence[str], msg_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` value: one entry per active secret, space-separated."""
    return " ".join(sign(s, msg_id, timestamp, body) for s in secrets)


class TenantSecrets:
    """Webhook secrets from the tenants file, re-read when the file changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime: float | None = None
        self._tenants: dict[str, TenantSpec] = {}

    def secrets(self, tenant: str, secret_id: str | None) -> list[str]:
        self._reload()
        spec = self._tenants.get(tenant)
        return spec.secrets_for(secret_id) if spec else []

    def _reload(self) -> None:
        if self.path is None:
            return
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError as exc:
            log.error("tenants file unreadable; keeping the secrets already loaded", error=str(exc))
            return
        if mtime == self._mtime:
            return
        try:
            self._tenants = load_tenants(self.path)
            self._mtime = mtime
        except ValueError as exc:
            log.error("tenants file invalid; keeping the secrets already loaded", error=str(exc)[:300])
