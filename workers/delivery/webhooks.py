"""Webhook callbacks: signed POSTs of a job's result envelope, with retries and a dead letter.

After a package's results are written, the worker puts one delivery per terminal job that asked
for a webhook in the outbox (``producer/contract/deliveries.py``: a line per tenant), in the
same step. The worker's delivery loop (``workers.delivery.outbox``) claims them in batches,
sends them here (``attempt``) and writes what became of them in batches (``settle``), so
deliveries never run in the inference path and cost no Redis round trip each.

Signing is Standard Webhooks v1 (``workers.delivery.signing``) with the tenant's secrets from the tenants
file. Outcomes: 2xx delivered; network error, timeout, 429 or 5xx retried on the schedule, never
sooner than ``Retry-After``; 410 disables the endpoint; redirects are not followed; other 4xx
and URLs the SSRF guard (``workers.delivery.ssrf``) refuses are not retried. What is given up lands in the
tenant's dead letters (bounded in count, age and body size; the API lists and replays them). The
delivery state records every attempt; URLs are logged and stored with credentials and query
values masked. docs/api.md has the whole contract.
"""

from __future__ import annotations

import random
import time
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
    remove_delivery,
    unpack,
    webhook_id_for,
)
from producer.contract.deliveries import LUA_ADD_DEAD_LETTER, mask_webhook_url

from ..core.retry_after import retry_after_s
from .http1 import Answer, Http1Pool
from .settings import WebhookSettings
from .signing import TenantSecrets, signature_header
from .ssrf import Allowlist, Target, UrlRefused, check_url

log = get_logger("workers.delivery.webhooks")


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


class Webhooks:
    """Puts deliveries in the outbox after results are written; attempts and settles them."""

    def __init__(self, redis: Any, keys: Keys, settings: WebhookSettings | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings or WebhookSettings()
        self.allow = Allowlist(self.settings.webhook_allow_hosts)
        self.secrets = TenantSecrets(self.settings.tenants_file)
        self._add_dead_letter = redis.register_script(LUA_ADD_DEAD_LETTER)
        self.http = Http1Pool()  # no proxies from the environment, no redirects followed

    async def aclose(self) -> None:
        await self.http.aclose()

    # ------------------------------------------------------------------ outbox

    async def enqueue(
        self, items: Sequence[WorkItem], results: Sequence[JobResult], written: Sequence[bool]
    ) -> int:
        """Put one delivery per newly terminal job that has a webhook in the outbox; never raises."""
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
                    add_delivery(pipe, self.keys, d, wake=d is deliveries[-1])
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

    async def adopt(self, d: Delivery) -> str:
        """Move a delivery queued before the outbox (an arq job) into the outbox."""
        async with self.redis.pipeline(transaction=True) as pipe:
            add_delivery(pipe, self.keys, d)
            await pipe.execute()
        return "adopted"

    async def checks(self, deliveries: Sequence[Delivery]) -> list[str | None]:
        """One round trip for a batch: ``"duplicate"`` for a delivery already delivered (a worker
        died before it took it out), the reason its endpoint was disabled, or None."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for d in deliveries:
                pipe.hget(self.keys.webhook(d.job_id), "state")
                pipe.hget(self.keys.disabled_endpoints(), d.url)
            answers = await pipe.execute()
        out: list[str | None] = []
        for i in range(0, len(answers), 2):
            done = _text(answers[i]) == DeliveryState.delivered
            out.append("duplicate" if done else _text(answers[i + 1]))
        return out

    async def attempt(self, d: Delivery, disabled: str | None = None) -> Attempt:
        """One attempt at ``d`` (nothing written to Redis): the SSRF guard, then the signed POST."""
        if disabled:
            return Attempt(
                error=ErrorInfo(type="endpoint_disabled", message=f"endpoint disabled: {disabled}")
            )
        try:
            target = await check_url(d.url, self.allow)
        except UrlRefused as exc:
            log.warning("webhook URL refused", job_id=d.job_id, url=mask_webhook_url(d.url), reason=str(exc))
            return Attempt(error=ErrorInfo(type="url_refused", message=str(exc)))
        return await self._post(target, d)

    async def settle(self, pipe: Any, d: Delivery, attempt: Attempt | None) -> str:
        """Queue on ``pipe`` what follows ``attempt`` (None: a duplicate); returns the outcome."""
        if attempt is None:
            remove_delivery(pipe, self.keys, d)
            log.info("webhook already delivered; not sending again", job_id=d.job_id, webhook_id=d.webhook_id)
            return "duplicate"
        if attempt.delivered:
            return self._delivered(pipe, d, attempt)
        if attempt.disable:
            when = time.strftime("%FT%TZ", time.gmtime())
            pipe.hset(self.keys.disabled_endpoints(), d.url, f"answered 410 Gone at {when}")
        if attempt.retryable and d.attempt <= len(self.settings.webhook_retry_schedule_s):
            return self._retry(pipe, d, attempt)
        return await self._dead(pipe, d, attempt)

    async def deliver(self, d: Delivery) -> str:
        """Attempt and settle one delivery on its own (the outbox does the same in batches)."""
        (check,) = await self.checks([d])
        attempt = None if check == "duplicate" else await self.attempt(d, check)
        async with self.redis.pipeline(transaction=True) as pipe:
            outcome = await self.settle(pipe, d, attempt)
            await pipe.execute()
        return outcome

    async def _post(self, target: Target, d: Delivery) -> Attempt:
        timestamp = int(time.time())
        body = d.body.encode()
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
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode("latin-1")
        scheme, ip, port, server_name = target.connect_to()
        try:
            answer = await self.http.post(
                scheme,
                ip,
                port,
                server_name,
                target.url.raw_path,
                head,
                body,
                self.settings.webhook_timeout_s,
            )
        except TimeoutError:
            message = f"no answer within {self.settings.webhook_timeout_s:g}s"
            return Attempt(error=ErrorInfo(type="timeout", message=message), retryable=True)
        except OSError as exc:  # refused, reset, TLS, or an answer that is not HTTP/1.1
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return Attempt(error=ErrorInfo(type="network_error", message=message), retryable=True)
        return await self._classify(target, answer)

    async def _classify(self, target: Target, resp: Answer) -> Attempt:
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

    async def _redirect_error(self, target: Target, resp: Answer) -> ErrorInfo:
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

    def _delivered(self, pipe: Any, d: Delivery, attempt: Attempt) -> str:
        self._state(
            pipe, d, DeliveryState.delivered, attempts=d.attempt, last_status=attempt.status_code,
            delivered_at=time.time(), error_type=None, error=None,
        )  # fmt: skip
        remove_delivery(pipe, self.keys, d)
        log.info(
            "webhook delivered", job_id=d.job_id, webhook_id=d.webhook_id, attempt=d.attempt,
            status=attempt.status_code,
        )  # fmt: skip
        return "delivered"

    def _retry(self, pipe: Any, d: Delivery, attempt: Attempt) -> str:
        delay = self.settings.webhook_retry_schedule_s[d.attempt - 1]
        if attempt.retry_after_s is not None:
            delay = max(delay, min(attempt.retry_after_s, self.settings.webhook_max_retry_after_s))
        delay *= 1 + random.uniform(0, self.settings.webhook_jitter)
        assert attempt.error is not None
        self._state(
            pipe, d, DeliveryState.retrying, attempts=d.attempt, last_status=attempt.status_code,
            error_type=attempt.error.type, error=attempt.error.message, next_at=time.time() + delay,
        )  # fmt: skip
        add_delivery(
            pipe, self.keys, d.model_copy(update={"attempt": d.attempt + 1, "waits": 0}), defer_s=delay
        )
        log.warning(
            "webhook attempt failed; retrying",
            job_id=d.job_id,
            webhook_id=d.webhook_id,
            attempt=d.attempt,
            status=attempt.status_code,
            error=attempt.error.message,
            retry_in_s=round(delay, 2),
        )
        return "retrying"

    async def _dead(self, pipe: Any, d: Delivery, attempt: Attempt) -> str:
        error = attempt.error or ErrorInfo(type="unknown", message="delivery failed")
        if attempt.retryable:
            tries = d.attempt
            error = ErrorInfo(
                type="retries_exhausted", message=f"{tries} attempts failed; last: {error.message}"
            )
        letter = self._letter(d, error, attempt)
        s = self.settings
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
        remove_delivery(pipe, self.keys, d)
        log.warning(
            "webhook dead-lettered", job_id=d.job_id, webhook_id=d.webhook_id, error_type=error.type,
            error=error.message, attempts=d.attempt,
        )  # fmt: skip
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
