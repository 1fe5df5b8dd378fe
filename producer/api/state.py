"""ApiState: what every route shares (the client and its Redis, tenants, limits)."""

from __future__ import annotations

from typing import Any

import httpx
import structlog
from fastapi import Request

from ..client import Client
from ..contract import JobKind, JobOptions, Lane, Status, TenantSpec
from ..errors import ApiError, GatewayTimeout, JobTimeout, NotFound
from .error_handlers import job_error
from .known_models import KnownModels
from .middleware import TENANT_STATE
from .settings import ApiSettings
from .tenants import QueueQuota, RateLimiter, TenantRegistry


class ApiState:
    """What the routes share: the client (and its Redis), tenants and limits."""

    def __init__(self, settings: ApiSettings, tenants: TenantRegistry) -> None:
        self.settings = settings
        self.tenants = tenants
        self.client = Client(
            settings.redis_url,
            prefix=settings.prefix,
            limits=settings.limits,
            result_ttl_s=settings.result_ttl_s,
        )
        self.redis = self.client.redis
        self.keys = self.client.keys
        self.rate = RateLimiter(self.redis, self.keys)
        self.quota = QueueQuota(self.redis, self.keys, settings.result_ttl_s)
        self.models = KnownModels(self.redis, self.keys)

    async def authenticate(self, request: Request) -> TenantSpec:
        """The request's tenant, charged one request of its rate limit."""
        tenant = getattr(request.state, TENANT_STATE, None)  # found by the early refusal
        if tenant is None:
            tenant = self.tenants.authenticate(request.headers.get("authorization"))
        structlog.contextvars.bind_contextvars(tenant=tenant.name)
        await self.rate.check(tenant)
        return tenant

    async def submit(
        self, tenant: TenantSpec, kind: JobKind, body: dict[str, Any], options: JobOptions
    ) -> str:
        check_webhook(tenant, options, self.tenants.open)
        # An unknown model: 404; one that cannot serve what the body asks for: 400; not queued.
        stays_local = options.local_only or options.route == "local"
        await self.models.check(kind, body, self.client.limits, stays_local=stays_local)
        tokens = await self.quota.check(tenant)
        try:
            job_id = await self.client.submit_with(kind, body, options)
        except BaseException:
            await self.quota.release(tenant, tokens)
            raise
        await self.quota.track(tenant, [job_id], tokens)
        return job_id

    async def run_sync(
        self, tenant: TenantSpec, kind: JobKind, body: dict[str, Any], idempotency_key: str | None
    ) -> dict[str, Any]:
        """Submit an interactive job and wait for its body; a failed job becomes an error."""
        timeout = self.settings.sync_timeout_s
        options = JobOptions(
            lane=Lane.interactive, deadline=timeout, tenant=tenant.name, idempotency_key=idempotency_key
        )
        job_id = await self.submit(tenant, kind, body, options)
        try:
            result = await self.client.wait(job_id, timeout + 5.0, tenant=tenant.name)
        except JobTimeout:
            raise GatewayTimeout(f"job {job_id} did not finish within {timeout:g}s", code="timeout") from None
        if result.status == Status.succeeded and result.body is not None:
            return result.body
        raise job_error(result)


def check_webhook(tenant: TenantSpec, options: JobOptions, open_mode: bool) -> None:
    if options.webhook is None:
        return
    try:
        url = httpx.URL(options.webhook.url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ApiError(f"webhook url is not a valid URL: {exc}", param="options.webhook.url") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ApiError("webhook url must be an absolute http(s) URL", param="options.webhook.url")
    secret_id = options.webhook.secret_id
    if secret_id is not None and not open_mode and secret_id not in tenant.webhook_secrets:
        # A 404, as any name of a thing the tenant does not have: the request itself is well formed.
        raise NotFound(
            f"unknown webhook secret id {secret_id!r}",
            param="options.webhook.secret_id",
            code="unknown_secret_id",
        )


def checked_idempotency_key(key: str | None) -> str | None:
    """``key`` if it has 1 to 256 characters (or is None); a 400 naming the header otherwise."""
    if key is not None and not 1 <= len(key) <= 256:
        raise ApiError("an idempotency key has 1 to 256 characters", param="Idempotency-Key")
    return key


def idempotency_of(request: Request) -> str | None:
    """The request's ``Idempotency-Key`` header, checked."""
    return checked_idempotency_key(request.headers.get("idempotency-key"))
