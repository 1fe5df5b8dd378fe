"""Webhook callbacks: signed POSTs of a job's result envelope, with retries and a dead letter.

After a package's results are written, the worker queues one ``deliver_webhook`` arq job per
terminal job that asked for a webhook, on its own queue (``Keys.webhooks()``) served by its own
arq Worker in the same process, so deliveries never run in the inference path (a worker killed
between the two writes loses those callbacks; the results themselves are safe). A tenant may
have at most ``OVERSPILL_WEBHOOK_TENANT_MAX_INFLIGHT`` deliveries in flight per worker, so a slow
receiver cannot hold every slot; one over its cap goes back on the queue and frees its slot.

Signing is Standard Webhooks v1 (``workers.delivery.signing``) with the tenant's secrets from the tenants
file. Outcomes: 2xx delivered; network error, timeout, 429 or 5xx retried on the schedule, never
sooner than ``Retry-After``; 410 disables the endpoint; redirects are not followed; other 4xx
and URLs the SSRF guard (``workers.delivery.ssrf``) refuses are not retried. What is given up lands in the
tenant's dead letters (bounded in count, age and body size; the API lists and replays them). The
delivery state records every attempt; URLs are logged and stored with credentials and query
values masked. docs/api.md has the whole contract.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from redis.exceptions import RedisError

from producer.contract import (
    DeadLetter,
    Delivery,
    DeliveryState,
    ErrorInfo,
    JobResult,
    Keys,
    WorkItem,
    add_delivery,
    get_logger,
    unpack,
    webhook_id_for,
)
from producer.contract.deliveries import LUA_ADD_DEAD_LETTER, mask_webhook_url

from ..core.retry_after import retry_after_s
from .settings import WebhookSettings
from .signing import TenantSecrets, signature_header
from .ssrf import Allowlist, Target, UrlRefused, check_url

log = get_logger("workers.delivery.webhooks")

# Deferred deliveries of one tenant come back spread over up to this fraction more, not in a herd.
WAIT_JITTER = 0.25
DRAIN_BYTES = 64 * 1024  # of a receiver's answer, read so its connection is reused
DRAIN_S = 0.5  # at most this long


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


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class TenantSlots:
    """Deliveries in flight per tenant in this worker, each tenant below a cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.inflight: Counter[str] = Counter()

    def take(self, tenant: str) -> bool:
        """Count one more delivery of ``tenant`` in flight, unless it is at its cap."""
        if self.inflight[tenant] >= self.cap:
            return False
        self.inflight[tenant] += 1
        return True

    def release(self, tenant: str) -> None:
        self.inflight[tenant] -= 1
        if self.inflight[tenant] <= 0:
            del self.inflight[tenant]


async def drain(resp: httpx.Response) -> None:
    """Read the rest of a short answer, so its connection goes back to the pool: httpx closes a
    connection whose answer was left unread, so every delivery opened a new one. A long or slow
    body is left unread (its connection closed), never waited for."""
    read = 0
    try:
        async with asyncio.timeout(DRAIN_S):
            async for chunk in resp.aiter_raw():
                read += len(chunk)
                if read > DRAIN_BYTES:
                    return
    except (TimeoutError, httpx.HTTPError):
        return


class Webhooks:
    """Queues deliveries after results are written, and runs them."""

    def __init__(self, redis: Any, keys: Keys, settings: WebhookSettings | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings or WebhookSettings()
        self.allow = Allowlist(self.settings.webhook_allow_hosts)
        self.secrets = TenantSecrets(self.settings.tenants_file)
        self.slots = TenantSlots(self.settings.webhook_tenant_max_inflight)
        self._add_dead_letter = redis.register_script(LUA_ADD_DEAD_LETTER)
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
                body=unpack(r).model_dump_json(exclude_none=True),  # as the caller asked: floats, if so
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
        mapping = {
            "state": state.value,
            "url": mask_webhook_url(d.url),  # the API shows this hash: no credentials or tokens
            "webhook_id": d.webhook_id,
            "updated_at": time.time(),
        }
        mapping.update({k: ("" if v is None else v) for k, v in fields.items()})
        pipe.hset(key, mapping=mapping)
        pipe.expire(key, self.settings.webhook_state_ttl_s)

    # ------------------------------------------------------------------ delivery

    async def run(self, d: Delivery) -> str:
        """Deliver ``d``, or put it off while its tenant has its cap of deliveries in flight here."""
        if not self.slots.take(d.tenant):
            return await self._defer(d)
        try:
            return await self.deliver(d)
        finally:
            self.slots.release(d.tenant)

    def tenant_wait_s(self, waits: int) -> float:
        """How long a delivery put off ``waits`` times before waits now: doubling, capped, jittered."""
        s = self.settings
        wait = min(s.webhook_tenant_wait_s * 2 ** min(waits, 30), s.webhook_tenant_max_wait_s)
        return wait * random.uniform(1.0, 1.0 + WAIT_JITTER)

    async def _defer(self, d: Delivery) -> str:
        """Queue ``d`` again a little later; its slot is free for other tenants meanwhile."""
        wait = self.tenant_wait_s(d.waits)
        async with self.redis.pipeline(transaction=True) as pipe:
            add_delivery(pipe, self.keys, d.model_copy(update={"waits": d.waits + 1}), defer_s=wait)
            await pipe.execute()
        log.debug("tenant at its webhook concurrency cap; delivery put off", wait_s=round(wait, 2))
        return "deferred"

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
            log.warning("webhook URL refused", url=mask_webhook_url(d.url), reason=str(exc))
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
            async with asyncio.timeout(self.settings.webhook_timeout_s) as deadline:
                async with self.http.stream(
                    "POST",
                    target.request_url(),
                    content=d.body.encode(),
                    headers=headers,
                    extensions=target.extensions(),
                ) as resp:
                    attempt = await self._classify(target, resp)
                    deadline.reschedule(None)  # answered: reading the rest must not make it a timeout
                    await drain(resp)
                    return attempt
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
            log.warning("webhook redirect refused", url=mask_webhook_url(str(target.url)), reason=str(exc))
            return ErrorInfo(
                type="url_refused", message=f"redirect to {mask_webhook_url(where)} refused: {exc}"
            )
        message = f"answered {resp.status_code} redirecting to {mask_webhook_url(where)}; redirects are not followed"
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
            retry = d.model_copy(update={"attempt": d.attempt + 1, "waits": 0})
            add_delivery(pipe, self.keys, retry, defer_s=delay)
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
        letter = self._letter(d, error, attempt)
        s = self.settings
        async with self.redis.pipeline(transaction=True) as pipe:
            await self._add_dead_letter(  # queued on the pipeline
                keys=[self.keys.dead_letters(d.tenant), self.keys.dead_letter_order(d.tenant)],
                args=[d.webhook_id, letter.model_dump_json(), letter.failed_at,
                      s.webhook_dead_letter_ttl_s, s.webhook_dead_letter_max],
                client=pipe,
            )  # fmt: skip
            self._state(
                pipe, d, DeliveryState.dead, attempts=d.attempt, last_status=attempt.status_code,
                error_type=error.type, error=error.message,
            )  # fmt: skip
            await pipe.execute()
        log.warning("webhook dead-lettered", error_type=error.type, error=error.message, attempts=d.attempt)
        return "dead"

    def _letter(self, d: Delivery, error: ErrorInfo, attempt: Attempt) -> DeadLetter:
        """The dead letter of ``d``; a large body is left to the job record (the same bytes)."""
        now = time.time()
        in_job = len(d.body.encode()) > self.settings.webhook_dead_letter_body_max_bytes
        return DeadLetter(
            delivery=d.model_copy(update={"body": ""}) if in_job else d,
            body_in_job=in_job,
            error=error,
            status_code=attempt.status_code,
            attempts=d.attempt,
            failed_at=now,
            expires_at=now + self.settings.webhook_dead_letter_ttl_s,
        )
