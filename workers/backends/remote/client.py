"""The remote backend: an OpenAI-compatible HTTP API the worker spills to.

:class:`RemoteBackend` owns one shared ``httpx.AsyncClient`` (connection limits, timeouts)
and its own concurrency limit, and is the only retry loop: connect errors, timeouts, 408,
409 and 5xx are retried with exponential backoff and full jitter; 429 waits ``Retry-After``
(seconds or an HTTP date, capped). Other 4xx fail at once with the remote's own message.
A 2xx whose body is not the expected JSON is an error like a 5xx, never a crash.

The API key (:class:`ApiKey`) is redacted from every message that leaves this module.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from producer.contract import get_logger

from ...core.errors import RemoteBadResponse, RemoteLacks, RemoteRejected, RemoteUnavailable
from ...core.metrics import REMOTE_EMPTY, REMOTE_REQUESTS
from ...core.retry_after import retry_after_s
from ...core.shards import ShardedClient
from ..base import ChatDelta
from .config import ApiKey, RemoteConfig, redact
from .ratelimit import SharedLimiter, estimate_tokens, reported_tokens
from .sse import ChunkParser, stream_payload

log = get_logger(__name__)

_RETRY_STATUS = frozenset({408, 409})
# What a server answers for an endpoint it does not have, or a method it does not take.
_LACKS_STATUS = frozenset({404, 405, 501})
# Phrases of a 4xx that says the endpoint or model is not offered (vLLM, TGI, LiteLLM, OpenAI).
_LACKS_WORDS = ("not supported", "unsupported", "not enabled", "does not exist", "not found", "no such model")


def _error_message(response: httpx.Response) -> str:
    """The remote's own error text: OpenAI's ``error.message``, else a short body excerpt."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:500]
        if isinstance(err, str):
            return err[:500]
        if isinstance(data.get("message"), str):
            return data["message"][:500]
    return str(data)[:200]


class _Retry(Exception):
    """One attempt failed in a way worth another try, after ``delay_s`` if the remote said so."""

    def __init__(
        self,
        message: str,
        delay_s: float | None = None,
        error: type[RemoteUnavailable] = RemoteUnavailable,
        *,
        rate_limited: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.delay_s = delay_s
        self.error = error
        self.rate_limited = rate_limited


class RemoteBackend:
    """POSTs JSON to the remote, with the retry policy above; returns the decoded JSON object."""

    def __init__(
        self, config: RemoteConfig, *, rng: random.Random | None = None, limiter: SharedLimiter | None = None
    ) -> None:
        self.config = config
        self.limiter = limiter  # the provider's limits shared with every worker, if it has any
        self.key = ApiKey(config)
        self._rng = rng or random.Random()
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self._tls = httpx.create_ssl_context()  # httpx's default, made once for every shard
        self._clients = ShardedClient(self._new_client, config.max_connections)

    def _new_client(self, connections: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.config.base_url.rstrip("/") + "/",
            timeout=httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            verify=self._tls,
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._clients.aclose()

    def _backoff_s(self, attempt: int) -> float:
        ceiling = min(self.config.backoff_s * 2**attempt, self.config.backoff_max_s)
        return self._rng.uniform(0, ceiling)  # full jitter

    async def post(self, endpoint: str, payload: dict[str, Any], *, give_up_at: float | None = None) -> Any:
        """Send, retrying per policy; raise RemoteRejected, RemoteUnavailable or RemoteBadResponse."""
        attempt = 0
        while True:
            key = self.key.get()
            try:
                return await self._limited(endpoint, payload, key, give_up_at)
            except _Retry as exc:
                last = exc
            except RemoteLacks as exc:
                raise RemoteLacks(redact(exc.message, key)) from None
            except RemoteRejected as exc:
                raise RemoteRejected(redact(exc.message, key)) from None
            delay = self._backoff_s(attempt) if last.delay_s is None else last.delay_s
            out_of_time = give_up_at is not None and time.time() + delay > give_up_at
            if attempt >= self.config.max_retries or out_of_time:
                message = f"remote {endpoint} failed after {attempt + 1} tries: {last.message}"
                raise last.error(redact(message, key))
            log.info("remote retry", endpoint=endpoint, attempt=attempt + 1, delay_s=round(delay, 3))
            await asyncio.sleep(delay)
            attempt += 1

    async def _limited(
        self, endpoint: str, payload: dict[str, Any], key: str, give_up_at: float | None
    ) -> Any:
        """One attempt inside the provider's shared limits: a slot first, its true cost after."""
        if self.limiter is None:
            return await self._attempt(endpoint, payload, key)
        lease = await self.limiter.acquire(estimate_tokens(endpoint, payload), give_up_at=give_up_at)
        data: Any = None
        try:
            data = await self._attempt(endpoint, payload, key)
            return data
        except _Retry as exc:
            if exc.rate_limited:
                await self.limiter.penalise(exc.delay_s if exc.delay_s is not None else 1.0)
            raise
        finally:
            await self.limiter.release(lease, reported_tokens(data))

    async def _attempt(self, endpoint: str, payload: dict[str, Any], key: str) -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            async with self._slots, self._clients.lease() as client:
                response = await client.post(endpoint, json=payload, headers=headers)
        except httpx.TimeoutException as exc:
            REMOTE_REQUESTS.labels(endpoint, "timeout").inc()
            raise _Retry(f"timeout ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            REMOTE_REQUESTS.labels(endpoint, "unreachable").inc()
            raise _Retry(f"unreachable ({type(exc).__name__})") from None
        status = response.status_code
        REMOTE_REQUESTS.labels(endpoint, str(status)).inc()
        if status == 429:
            wait = retry_after_s(response.headers.get("retry-after"), self.config.retry_after_max_s)
            raise _Retry(f"429 rate limited: {_error_message(response)}", wait, rate_limited=True)
        if status in _LACKS_STATUS or (
            status in (400, 422) and any(w in _error_message(response).lower() for w in _LACKS_WORDS)
        ):
            raise RemoteLacks(f"remote does not serve {endpoint} ({status}): {_error_message(response)}")
        if status >= 500 or status in _RETRY_STATUS:
            raise _Retry(f"{status}: {_error_message(response)}")
        if status >= 400:
            raise RemoteRejected(f"remote rejected the request ({status}): {_error_message(response)}")
        try:
            data = response.json()
        except ValueError:
            raise _Retry(
                f"body is not JSON ({len(response.content)} bytes)", error=RemoteBadResponse
            ) from None
        if not isinstance(data, dict):
            raise _Retry(f"body is JSON {type(data).__name__}, not an object", error=RemoteBadResponse)
        return data

    # ------------------------------------------------------------------ streamed chat

    async def chat_stream(self, model: str, messages: str, params: str) -> AsyncIterator[ChatDelta]:
        """The remote's SSE chat stream as :class:`ChatDelta` s (the interface of
        ``TritonBackend.chat_stream``); the last one carries the finish and the token counts.

        Failures before the first byte of the answer are retried as :meth:`post` retries; after
        it, a broken or malformed stream raises :class:`RemoteUnavailable` (the caller ends the
        job's stream). Closing the iterator early closes the connection, which stops the remote.
        """
        payload = stream_payload(model, messages, params)
        attempt = 0
        while True:
            key = self.key.get()
            lease = None
            if self.limiter is not None:
                lease = await self.limiter.acquire(estimate_tokens("chat/completions", payload))
            used: int | None = None
            texted = False
            try:
                async with self._slots:
                    async for delta in self._sse(payload, key):
                        texted = texted or bool(delta.text)
                        if delta.finish_reason is not None:
                            used = delta.prompt_tokens + delta.completion_tokens
                            if not texted:  # a stream with nothing in it: not a success
                                empty_reply(self.config, None, "stream")
                        yield delta
                return
            except _Retry as exc:
                if exc.rate_limited and self.limiter is not None:
                    await self.limiter.penalise(exc.delay_s if exc.delay_s is not None else 1.0)
                delay = self._backoff_s(attempt) if exc.delay_s is None else exc.delay_s
                if attempt >= self.config.max_retries:
                    message = (
                        f"remote chat/completions stream failed after {attempt + 1} tries: {exc.message}"
                    )
                    raise exc.error(redact(message, key)) from None
                log.info("remote stream retry", attempt=attempt + 1, delay_s=round(delay, 3))
            except (RemoteLacks, RemoteRejected) as exc:
                raise type(exc)(redact(exc.message, key)) from None
            finally:
                if lease is not None and self.limiter is not None:
                    await self.limiter.release(lease, used)
            await asyncio.sleep(delay)
            attempt += 1

    async def _sse(self, payload: dict[str, Any], key: str) -> AsyncIterator[ChatDelta]:
        """One streamed request; before its first delta, failures raise :class:`_Retry`."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        endpoint = "chat/completions"
        began = False
        try:
            async with (
                self._clients.lease() as client,
                client.stream("POST", endpoint, json=payload, headers=headers) as response,
            ):
                status = response.status_code
                REMOTE_REQUESTS.labels("chat/completions:stream", str(status)).inc()
                if status >= 300:
                    await response.aread()
                    _raise_for_status(response, endpoint)
                parser = ChunkParser()
                async for line in response.aiter_lines():
                    for delta in parser.feed(line):
                        began = True
                        yield delta
                    if parser.done:
                        return
                raise RemoteUnavailable("the remote's stream ended before its final chunk")
        except httpx.TimeoutException as exc:
            if not began:
                raise _Retry(f"timeout ({type(exc).__name__})") from None
            raise RemoteUnavailable(f"the remote's stream timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            if not began:
                raise _Retry(f"unreachable ({type(exc).__name__})") from None
            raise RemoteUnavailable(f"the remote's stream broke ({type(exc).__name__})") from None


def _raise_for_status(response: httpx.Response, endpoint: str) -> None:
    """The error a non-2xx answer means, as :meth:`RemoteBackend._attempt` maps it."""
    status = response.status_code
    message = _error_message(response)
    if status == 429:
        wait = retry_after_s(response.headers.get("retry-after"), 10.0)
        raise _Retry(f"429 rate limited: {message}", wait, rate_limited=True)
    if status in _LACKS_STATUS or (status in (400, 422) and any(w in message.lower() for w in _LACKS_WORDS)):
        raise RemoteLacks(f"remote does not serve {endpoint} ({status}): {message}")
    if status >= 500 or status in _RETRY_STATUS:
        raise _Retry(f"{status}: {message}")
    raise RemoteRejected(f"remote rejected the request ({status}): {message}")


def empty_reply(config: RemoteConfig, job_id: str | None, mode: str) -> None:
    """Count and log an empty chat answer; raise unless the remote is trusted to send them."""
    REMOTE_EMPTY.labels(mode).inc()
    log.warning(
        "remote answered an empty message", job_id=job_id, mode=mode, fault=config.empty_reply_is_fault
    )
    if config.empty_reply_is_fault:
        raise RemoteBadResponse(
            f"remote chat/completions {'streamed' if mode == 'stream' else 'answered'} an empty message"
        )
