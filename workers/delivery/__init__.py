"""Webhook callbacks: signed, SSRF-guarded deliveries with retries and dead letters."""

from .outbox import Outbox
from .settings import WebhookSettings
from .signing import TenantSecrets, sign, signature_header
from .ssrf import (
    AllowEntry,
    Allowlist,
    Target,
    UrlRefused,
    check_url,
    embedded_ipv4,
    forbidden_reason,
    parse_allow_entry,
    parse_url,
    refusal,
    resolve,
)
from .task import build_webhook_worker, deliver_webhook
from .webhooks import Attempt, Webhooks

__all__ = (
    "AllowEntry",
    "Allowlist",
    "Attempt",
    "Outbox",
    "Target",
    "TenantSecrets",
    "UrlRefused",
    "WebhookSettings",
    "Webhooks",
    "build_webhook_worker",
    "check_url",
    "deliver_webhook",
    "embedded_ipv4",
    "forbidden_reason",
    "parse_allow_entry",
    "parse_url",
    "refusal",
    "resolve",
    "sign",
    "signature_header",
)
