"""Webhook callbacks: signed POSTs of a job's result envelope, with retries and a dead letter.

Deliveries never run in the inference path: after a package's results are written, the
worker queues one ``deliver_webhook`` arq job per terminal job that asked for a webhook, on
its own queue (``Keys.webhooks()``) served by its own arq Worker in the same process.
Deliveries are queued right after the results are written, not in the same transaction: a
worker killed between the two loses those callbacks (the results themselves are safe).

Signing follows Standard Webhooks v1: headers ``webhook-id`` (stable across attempts and
replays), ``webhook-timestamp`` (unix seconds of this attempt) and ``webhook-signature``,
one ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` entry per active secret of the
tenant, so receivers keep verifying while a secret is rotated.

Where the secrets come from: the tenants file (``OVERSPILL_TENANTS_FILE``, see
``producer.contract.TenantSpec``), the same file the API reads for API keys; both sides are
given the same path. It is re-read when it changes, so rotating a secret needs no restart.
A tenant with no secrets (or no tenants file) gets unsigned callbacks.

Outcomes of an attempt:

- 2xx: delivered; the delivery state says so and no attempt follows, even on replay;
- network error, timeout, 429 or 5xx: retried on ``OVERSPILL_WEBHOOK_RETRY_SCHEDULE_S``
  (default 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, plus jitter), never sooner than a
  ``Retry-After`` asks;
- 410 Gone: the endpoint is disabled (later deliveries to it go straight to the dead letter
  until one of them is replayed);
- a redirect is not followed (its target is still checked, so the error says when it pointed
  somewhere forbidden); other 4xx: not retried;
- a URL the SSRF guard (``workers.ssrf``) refuses: not sent at all.

Deliveries that are given up land in the tenant's dead-letter hash
(``Keys.dead_letters(tenant)``) with the reason; the API lists and replays them. The job's
delivery state (``Keys.webhook(job_id)``) records every attempt's outcome; the job's result
itself is never changed by its callback.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import structlog
from arq.connections import RedisSettings
from arq.worker import Worker, func
from pydantic import ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from redis.exceptions import RedisError

from producer.contract import (
    WEBHOOK_TASK,
    DeadLetter,
    Delivery,
    DeliveryState,
    ErrorInfo,
    JobResult,
    Keys,
    WorkItem,
    add_delivery,
    get_logger,
    pack_job,
    unpack_job,
    webhook_id_for,
)

from .metrics import WEBHOOK_DELIVERIES
from .queue import PackageWorker
from .signing import TenantSecrets, signature_header
from .ssrf import Allowlist, Target, UrlRefused, check_url

log = get_logger("workers.webhooks")

DEFAULT_SCHEDULE_S = [5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0]


class WebhookSettings(BaseSettings):
    """Webhook delivery settings, from ``OVERSPILL_*`` like the rest of the worker.

    Lists accept JSON or comma-separated values: ``OVERSPILL_WEBHOOK_ALLOW_HOSTS=127.0.0.1,10.1.0.0/16``.
    """

    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="ignore")

    tenants_file: Path | None = None
    webhook_timeout_s: float = 15.0
    webhook_retry_schedule_s: Annotated[list[float], NoDecode] = DEFAULT_SCHEDULE_S
    webhook_jitter: float = 0.1  # a retry waits up to this fraction longer
    webhook_max_retry_after_s: float = 24 * 3600.0
    webhook_allow_hosts: Annotated[list[str], NoDecode] = []
    webhook_max_jobs: int = 64
    webhook_poll_delay_s: float = 0.05
    webhook_state_ttl_s: int = 7 * 24 * 3600

    @field_validator("webhook_retry_schedule_s", "webhook_allow_hosts", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("["):
                return json.loads(v)
            return [p.strip() for p in v.split(",") if p.strip()]
        return v


# ---------------------------------------------------------------------------- attempts


@dataclass(slots=True)
class Attempt:
    """What one POST came to."""

    delivered: bool = False
    status_code: int | None = None
    error: ErrorInfo | None = None
    retryable: bool = False
    retry_after_s: float | None = None
    disable: bool = False


def retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), or ``None``."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _safe_url(url: str) -> str:
    """The URL without query or fragment, for logs (queries often carry tokens)."""
    try:
        u = httpx.URL(url)
        return str(u.copy_with(query=None, fragment=None))
    except (httpx.InvalidURL, ValueError):
        return "<invalid url>"


class Webhooks:
    """Queues deliveries after results are written, and runs them."""

    def __init__(self, redis: Any, keys: Keys, settings: WebhookSettings | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings or WebhookSettings()
        self.allow = Allowlist(self.settings.webhook_allow_hosts)
        self.secrets = TenantSecrets(self.settings.tenants_file)
        self.http = httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(self.settings.webhook_timeout_s),
            limits=httpx.Limits(max_connections=self.settings.webhook_max_jobs),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    # ------------------------------------------------------------------ outbox

    async def enqueue(
        self, items: Sequence[WorkItem], results: Sequence[JobResult], written: Sequence[bool]
    ) -> int:
        """Queue one delivery per newly terminal job that has a webhook; never raises."""
        hooks = {i.id: i.webhook for i in items if i.webhook is not None}
        deliveries = [
            Delivery(
                webhook_id=webhook_id_for(r.id),
                job_id=r.id,
                tenant=r.tenant,
                url=hooks[r.id].url,
                secret_id=hooks[r.id].secret_id,
                body=r.model_dump_json(exclude_none=True),
            )
            for r, w in zip(results, written, strict=True)
            if w and r.id in hooks
        ]
        if not deliveries:
            return 0
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                for d in deliveries:
                    self._state(pipe, d, DeliveryState.pending, attempts=0)
                    add_delivery(pipe, self.keys, d)
                await pipe.execute()
        except RedisError as exc:
            log.error("could not queue webhook deliveries", jobs=len(deliveries), error=str(exc))
            return 0
        return len(deliveries)

    def _state(self, pipe: Any, d: Delivery, state: DeliveryState, **fields: Any) -> None:
        key = self.keys.webhook(d.job_id)
        mapping = {"state": state.value, "url": d.url, "webhook_id": d.webhook_id, "updated_at": time.time()}
        mapping.update({k: ("" if v is None else v) for k, v in fields.items()})
        pipe.hset(key, mapping=mapping)
        pipe.expire(key, self.settings.webhook_state_ttl_s)

    # ------------------------------------------------------------------ delivery

    async def deliver(self, d: Delivery) -> str:
        """Make one attempt and decide what follows; returns the outcome's name."""
        if _text(await self.redis.hget(self.keys.webhook(d.job_id), "state")) == DeliveryState.delivered:
            log.info("webhook already delivered; not sending again")
            return "duplicate"
        disabled = _text(await self.redis.hget(self.keys.disabled_endpoints(), d.url))
        if disabled:
            error = ErrorInfo(type="endpoint_disabled", message=f"endpoint disabled: {disabled}")
            return await self._dead(d, Attempt(error=error))
        try:
            target = await check_url(d.url, self.allow)
        except UrlRefused as exc:
            log.warning("webhook URL refused", url=_safe_url(d.url), reason=str(exc))
            return await self._dead(d, Attempt(error=ErrorInfo(type="url_refused", message=str(exc))))
        attempt = await self._post(target, d)
        if attempt.delivered:
            return await self._delivered(d, attempt)
        if attempt.disable:
            await self.redis.hset(
                self.keys.disabled_endpoints(),
                d.url,
                f"answered 410 Gone at {time.strftime('%FT%TZ', time.gmtime())}",
            )
        if attempt.retryable and d.attempt <= len(self.settings.webhook_retry_schedule_s):
            return await self._retry(d, attempt)
        return await self._dead(d, attempt)

    async def _post(self, target: Target, d: Delivery) -> Attempt:
        timestamp = int(time.time())
        headers = {
            **target.headers(),
            "content-type": "application/json",
            "user-agent": "overspill-webhooks/1",
            "webhook-id": d.webhook_id,
            "webhook-timestamp": str(timestamp),
        }
        secrets = self.secrets.secrets(d.tenant, d.secret_id)
        if secrets:
            headers["webhook-signature"] = signature_header(secrets, d.webhook_id, timestamp, d.body)
        try:
            async with asyncio.timeout(self.settings.webhook_timeout_s):
                async with self.http.stream(
                    "POST",
                    target.request_url(),
                    content=d.body.encode(),
                    headers=headers,
                    extensions=target.extensions(),
                ) as resp:
                    return await self._classify(target, resp)
        except TimeoutError:
            message = f"no answer within {self.settings.webhook_timeout_s:g}s"
            return Attempt(error=ErrorInfo(type="timeout", message=message), retryable=True)
        except httpx.TransportError as exc:
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return Attempt(error=ErrorInfo(type="network_error", message=message), retryable=True)

    async def _classify(self, target: Target, resp: httpx.Response) -> Attempt:
        code = resp.status_code
        if 200 <= code < 300:
            return Attempt(delivered=True, status_code=code)
        if code == 410:
            error = ErrorInfo(
                type="endpoint_gone", message="the receiver answered 410 Gone; endpoint disabled"
            )
            return Attempt(status_code=code, error=error, disable=True)
        if 300 <= code < 400:
            return Attempt(status_code=code, error=await self._redirect_error(target, resp))
        if code == 429 or code >= 500:
            error = ErrorInfo(type="http_error", message=f"the receiver answered {code}")
            after = retry_after_s(resp.headers.get("retry-after"))
            return Attempt(status_code=code, error=error, retryable=True, retry_after_s=after)
        error = ErrorInfo(type="http_error", message=f"the receiver answered {code}; not retried")
        return Attempt(status_code=code, error=error)

    async def _redirect_error(self, target: Target, resp: httpx.Response) -> ErrorInfo:
        location = resp.headers.get("location")
        if not location:
            return ErrorInfo(
                type="redirect_not_followed", message=f"answered {resp.status_code} without Location"
            )
        try:
            where = str(target.url.join(location))
        except (httpx.InvalidURL, ValueError):
            return ErrorInfo(type="redirect_not_followed", message="answered a redirect to an invalid URL")
        try:
            await check_url(where, self.allow)
        except UrlRefused as exc:
            log.warning("webhook redirect refused", url=_safe_url(str(target.url)), reason=str(exc))
            return ErrorInfo(type="url_refused", message=f"redirect to {_safe_url(where)} refused: {exc}")
        message = f"answered {resp.status_code} redirecting to {_safe_url(where)}; redirects are not followed"
        return ErrorInfo(type="redirect_not_followed", message=message)

    # ------------------------------------------------------------------ outcomes

    async def _delivered(self, d: Delivery, attempt: Attempt) -> str:
        async with self.redis.pipeline(transaction=True) as pipe:
            self._state(
                pipe, d, DeliveryState.delivered, attempts=d.attempt, last_status=attempt.status_code,
                delivered_at=time.time(), error_type=None, error=None,
            )  # fmt: skip
            await pipe.execute()
        log.info("webhook delivered", attempt=d.attempt, status=attempt.status_code)
        return "delivered"

    async def _retry(self, d: Delivery, attempt: Attempt) -> str:
        delay = self.settings.webhook_retry_schedule_s[d.attempt - 1]
        if attempt.retry_after_s is not None:
            delay = max(delay, min(attempt.retry_after_s, self.settings.webhook_max_retry_after_s))
        delay *= 1 + random.uniform(0, self.settings.webhook_jitter)
        assert attempt.error is not None
        async with self.redis.pipeline(transaction=True) as pipe:
            self._state(
                pipe, d, DeliveryState.retrying, attempts=d.attempt, last_status=attempt.status_code,
                error_type=attempt.error.type, error=attempt.error.message, next_at=time.time() + delay,
            )  # fmt: skip
            add_delivery(pipe, self.keys, d.model_copy(update={"attempt": d.attempt + 1}), defer_s=delay)
            await pipe.execute()
        log.warning(
            "webhook attempt failed; retrying",
            attempt=d.attempt,
            status=attempt.status_code,
            error=attempt.error.message,
            retry_in_s=round(delay, 2),
        )
        return "retrying"

    async def _dead(self, d: Delivery, attempt: Attempt) -> str:
        error = attempt.error or ErrorInfo(type="unknown", message="delivery failed")
        if attempt.retryable:
            tries = d.attempt
            error = ErrorInfo(
                type="retries_exhausted", message=f"{tries} attempts failed; last: {error.message}"
            )
        letter = DeadLetter(
            delivery=d,
            error=error,
            status_code=attempt.status_code,
            attempts=d.attempt,
            failed_at=time.time(),
        )
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.dead_letters(d.tenant), d.webhook_id, letter.model_dump_json())
            self._state(
                pipe, d, DeliveryState.dead, attempts=d.attempt, last_status=attempt.status_code,
                error_type=error.type, error=error.message,
            )  # fmt: skip
            await pipe.execute()
        log.warning("webhook dead-lettered", error_type=error.type, error=error.message, attempts=d.attempt)
        return "dead"


# ---------------------------------------------------------------------------- arq


async def deliver_webhook(ctx: dict[str, Any], payload: dict[str, Any]) -> str:
    """The arq function named ``producer.contract.WEBHOOK_TASK``."""
    webhooks: Webhooks = ctx["webhooks"]
    structlog.contextvars.clear_contextvars()
    try:
        delivery = Delivery.model_validate(payload)
    except ValidationError as exc:
        log.error("malformed webhook delivery", error=str(exc)[:200])
        return "malformed"
    structlog.contextvars.bind_contextvars(job_id=delivery.job_id, webhook_id=delivery.webhook_id)
    outcome = await webhooks.deliver(delivery)
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    return outcome


def build_webhook_worker(keys: Keys, webhooks: Webhooks, redis_settings: RedisSettings) -> Worker:
    """The arq Worker serving the delivery queue; runs beside the lane workers."""
    s = webhooks.settings
    task = func(
        deliver_webhook, name=WEBHOOK_TASK, timeout=s.webhook_timeout_s + 30, keep_result=0, max_tries=3
    )
    return PackageWorker(
        functions=[task],
        queue_name=keys.webhooks(),
        redis_settings=redis_settings,
        ctx={"webhooks": webhooks},
        handle_signals=False,
        max_jobs=s.webhook_max_jobs,
        poll_delay=s.webhook_poll_delay_s,
        keep_result=0,
        max_tries=3,
        job_serializer=pack_job,
        job_deserializer=unpack_job,
        log_results=False,
        health_check_interval=5,
    )
