"""The remote backend: an OpenAI-compatible HTTP API the worker spills to.

:class:`RemoteBackend` owns one shared ``httpx.AsyncClient`` (connection limits, timeouts)
and its own concurrency limit, and is the only retry loop: connect errors, timeouts, 408,
409 and 5xx are retried with exponential backoff and full jitter; 429 waits ``Retry-After``
(seconds or an HTTP date, capped). Other 4xx fail at once with the remote's own message.
A 2xx whose body is not the expected JSON is an error like a 5xx, never a crash.

:class:`RemoteHandlers` turns a job into a remote call and the answer back into the same
OpenAI/Cohere body the local handlers build (the builders live in ``handlers``).

The API key comes from ``OVERSPILL_REMOTE_API_KEY`` or a mounted secret file
(``OVERSPILL_REMOTE_API_KEY_FILE``), re-read when the file changes so a rotated key is used
without a restart. It is redacted from every message that leaves this module.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.contract import ChatRequest, EmbeddingRequest, JobKind, RerankRequest, WorkItem, get_logger

from .errors import RemoteBadResponse, RemoteLacks, RemoteRejected, RemoteUnavailable
from .handlers import Answer, chat_body, chat_params, embedding_body, rerank_body
from .local import ChatOutput
from .metrics import REMOTE_REQUESTS
from .ratelimit import SharedLimiter, estimate_tokens, reported_tokens
from .settings import ModelSpec, WorkerConfig
from .streaming import ChatDelta

log = get_logger(__name__)

_RETRY_STATUS = frozenset({408, 409})
# What a server answers for an endpoint it does not have, or a method it does not take.
_LACKS_STATUS = frozenset({404, 405, 501})
# Phrases of a 4xx that says the endpoint or model is not offered (vLLM, TGI, LiteLLM, OpenAI).
_LACKS_WORDS = ("not supported", "unsupported", "not enabled", "does not exist", "not found", "no such model")


FORWARD_FIELDS: dict[JobKind, set[str]] = {
    JobKind.embed: {"input", "dimensions"},
    JobKind.chat: {"messages", "max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
                   "frequency_penalty"},
    JobKind.rerank: {"query", "documents", "top_n"},
}  # fmt: skip


class RemoteConfig(BaseSettings):
    """The remote API: where it is, which of our models it serves, and how hard to try it."""

    model_config = SettingsConfigDict(env_prefix="OVERSPILL_REMOTE_", extra="forbid")

    base_url: str = ""  # e.g. https://api.openai.com/v1; empty: no remote
    api_key: SecretStr | None = None
    api_key_file: Path | None = None  # a mounted secret; wins over api_key
    # Local model name → the remote's name for it. Unmapped models keep their name.
    model_map: dict[str, str] = Field(default_factory=dict)
    # Local models the remote serves identically. Embeddings spill only to these: vectors
    # of two different models must never meet in one index.
    same_models: set[str] = Field(default_factory=set)
    max_concurrency: int = Field(default=32, ge=1)
    max_connections: int = Field(default=64, ge=1)
    timeout_s: float = Field(default=30.0, gt=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    backoff_s: float = Field(default=0.2, ge=0)
    backoff_max_s: float = Field(default=5.0, ge=0)
    retry_after_max_s: float = Field(default=10.0, ge=0)
    circuit_failures: int = Field(default=3, ge=1)
    circuit_reset_s: float = Field(default=5.0, ge=0)
    # Job kinds the remote serves. OpenAI has no rerank endpoint: rerank spills only when listed.
    kinds: set[JobKind] = Field(default_factory=lambda: {JobKind.chat, JobKind.embed})
    # Request fields forwarded to the remote, per kind; anything else a tenant sent (store,
    # service_tier, metadata, user, logprobs, ...) stays here: it could cost money or leak data.
    forward_fields: dict[JobKind, set[str]] = Field(default_factory=lambda: dict(FORWARD_FIELDS))
    # After the remote said it lacks an endpoint or model, jobs of it stay local this long;
    # the first job after that is the probe that finds out whether it is served now.
    unsupported_recheck_s: float = Field(default=300.0, ge=0)
    # Embedding jobs that spill together go as one request of at most this many inputs.
    max_batch_inputs: int = Field(default=2048, ge=1)

    @property
    def enabled(self) -> bool:
        return bool(self.base_url)

    def remote_model(self, local_name: str) -> str:
        return self.model_map.get(local_name, local_name)

    def serves(self, spec: ModelSpec) -> bool:
        """May jobs for this local model go to the remote at all?"""
        if not self.enabled or spec.kind not in self.kinds:
            return False
        if spec.kind == JobKind.embed:
            return spec.name in self.same_models
        return True


class ApiKey:
    """The current API key: from the secret file when one is set (re-read on change), else env."""

    def __init__(self, config: RemoteConfig) -> None:
        self._file = config.api_key_file
        self._env = config.api_key.get_secret_value() if config.api_key else ""
        self._stamp: tuple[int, int] | None = None
        self._value = self._env

    def get(self) -> str:
        if self._file is None:
            return self._env
        try:
            st = os.stat(self._file)
        except OSError:
            return self._value  # a secret being swapped in place: keep the last good key
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._value = self._file.read_text().strip()
                self._stamp = stamp
                log.info("remote API key loaded from file", file=str(self._file))
            except OSError:
                pass
        return self._value


def redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


def retry_after_s(value: str | None, cap_s: float, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date), capped; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(seconds, 0.0), cap_s)


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
        self._client = httpx.AsyncClient(
            base_url=config.base_url.rstrip("/") + "/",
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=config.max_connections, max_keepalive_connections=config.max_connections
            ),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

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
            async with self._slots:
                response = await self._client.post(endpoint, json=payload, headers=headers)
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
            try:
                async with self._slots:
                    async for delta in self._sse(payload, key):
                        if delta.finish_reason is not None:
                            used = delta.prompt_tokens + delta.completion_tokens
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
            async with self._client.stream("POST", endpoint, json=payload, headers=headers) as response:
                status = response.status_code
                REMOTE_REQUESTS.labels("chat/completions:stream", str(status)).inc()
                if status >= 300:
                    await response.aread()
                    _raise_for_status(response, endpoint)
                parser = _ChunkParser()
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


def stream_payload(model: str, messages: str, params: str) -> dict[str, Any]:
    """A streamed chat request from ``chat_stream``'s arguments (those of Triton's model)."""
    sampling = json.loads(params)
    payload: dict[str, Any] = {
        "model": model,
        "messages": json.loads(messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    for name in ("max_tokens", "temperature", "top_p", "seed", "stop"):
        if sampling.get(name) not in (None, []):
            payload[name] = sampling[name]
    return payload


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


class _ChunkParser:
    """OpenAI's chat SSE: ``data: {chunk}`` lines, then ``data: [DONE]``. The finish_reason and
    the usage chunk (``stream_options.include_usage``) may come apart: the last delta is given
    once both are known, or at ``[DONE]``."""

    def __init__(self) -> None:
        self.done = False
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, line: str) -> list[ChatDelta]:
        if not line.startswith("data:"):
            return []
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return [self._final("")] if self.finish is not None else []
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteBadResponse(
                f"the remote's stream sent a line that is not JSON: {data[:80]!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise RemoteBadResponse("the remote's stream sent a chunk that is not an object")
        if isinstance(chunk.get("error"), dict):
            raise RemoteUnavailable(f"the remote's stream failed: {chunk['error'].get('message', '')}"[:500])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        text = ""
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            self.finish = choice.get("finish_reason") or self.finish
        out = [ChatDelta(text)] if text else []
        if self.finish is not None and self.usage is not None:
            self.done = True
            out.append(self._final(""))
        return out

    def _final(self, text: str) -> ChatDelta:
        usage = self.usage or {}
        return ChatDelta(
            text,
            self.finish or "stop",
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
        )


# ---------------------------------------------------------------------------- response shapes


class _Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class _EmbeddingDatum(BaseModel):
    index: int
    embedding: list[float]


class _Embeddings(BaseModel):
    data: list[_EmbeddingDatum]
    usage: _Usage = Field(default_factory=_Usage)


class _RerankResult(BaseModel):
    index: int
    relevance_score: float


class _Rerank(BaseModel):
    results: list[_RerankResult]
    usage: _Usage = Field(default_factory=_Usage)


class _Message(BaseModel):
    content: str | None = None


class _Choice(BaseModel):
    message: _Message
    finish_reason: str | None = None


class _Chat(BaseModel):
    choices: list[_Choice] = Field(min_length=1)
    usage: _Usage = Field(default_factory=_Usage)


_Shape = TypeVar("_Shape", bound=BaseModel)


def _parse(shape: type[_Shape], data: Any, endpoint: str) -> _Shape:
    try:
        return shape.model_validate(data)
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"]) or "body"
        raise RemoteBadResponse(f"remote {endpoint} answered an unexpected body ({where})") from None


class RemoteHandlers:
    """Runs a job on the remote and returns the body the local handlers would have built."""

    def __init__(self, config: WorkerConfig, remote: RemoteConfig, backend: RemoteBackend) -> None:
        self.config = config
        self.remote = remote
        self.backend = backend

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def run(self, item: WorkItem, request: Any, spec: ModelSpec) -> Answer:
        started = time.monotonic()
        if isinstance(request, EmbeddingRequest):
            body = await self._embed(item, request, spec)
        elif isinstance(request, RerankRequest):
            body = await self._rerank(item, request, spec)
        elif isinstance(request, ChatRequest):
            body = await self._chat(item, request, spec)
        else:
            raise RemoteRejected(f"no remote handler for {item.kind}")
        infer_ms = (time.monotonic() - started) * 1000
        return Answer(body, body["model"], infer_ms=infer_ms, batch_size=1)

    async def embed_many(
        self, jobs: Sequence[tuple[WorkItem, EmbeddingRequest]], spec: ModelSpec
    ) -> list[Answer | Exception]:
        """Embedding jobs that leave together, as one request (OpenAI's ``input`` list).

        A 4xx for the combined request could be one input's fault: then each job is sent
        alone, so only the offender fails. An outage raises for all (they fail over together).
        """
        if len(jobs) == 1:
            return [await self._alone(*jobs[0], spec)]
        started = time.monotonic()
        texts = [text for _, request in jobs for text in request.texts()]
        payload = {"model": self.remote.remote_model(spec.name), "input": texts, "encoding_format": "float"}
        if jobs[0][1].dimensions:
            payload["dimensions"] = jobs[0][1].dimensions
        give_up_at = min(item.deadline_at for item, _ in jobs)
        try:
            data = await self.backend.post("embeddings", payload, give_up_at=give_up_at)
        except RemoteLacks:
            raise
        except RemoteRejected:
            return list(await asyncio.gather(*(self._alone(item, request, spec) for item, request in jobs)))
        parsed = _parse(_Embeddings, data, "embeddings")
        by_index = {d.index: d.embedding for d in parsed.data}
        if sorted(by_index) != list(range(len(texts))):
            raise RemoteBadResponse(f"remote returned {len(parsed.data)} embeddings for {len(texts)} inputs")
        tokens = parsed.usage.prompt_tokens or parsed.usage.total_tokens
        chars = sum(len(t) for t in texts) or 1
        infer_ms = (time.monotonic() - started) * 1000
        answers: list[Answer | Exception] = []
        offset = 0
        for _, request in jobs:
            own = request.texts()
            vectors = [by_index[offset + k] for k in range(len(own))]
            offset += len(own)
            share = round(tokens * sum(len(t) for t in own) / chars)  # usage split by input size
            body = embedding_body(self._reported_model(spec), vectors, share, request.encoding_format)
            answers.append(Answer(body, body["model"], infer_ms=infer_ms, batch_size=len(jobs)))
        return answers

    async def _alone(self, item: WorkItem, request: EmbeddingRequest, spec: ModelSpec) -> Answer | Exception:
        try:
            return await self.run(item, request, spec)
        except Exception as exc:  # this job's own outcome, whatever its companions get
            return exc

    def _payload(self, item: WorkItem, spec: ModelSpec) -> dict[str, Any]:
        # The job body is already the OpenAI/Cohere request: send its allowed fields, renamed.
        allowed = self.remote.forward_fields.get(item.kind, set())
        payload = {k: v for k, v in item.body.items() if k in allowed}
        payload["model"] = self.remote.remote_model(spec.name)
        return payload

    def reported_model(self, spec: ModelSpec) -> str:
        """The model a result body names when this remote ran it."""
        return self._reported_model(spec)

    def _reported_model(self, spec: ModelSpec) -> str:
        # Identical models keep our name; a different remote model is named as what it is.
        if spec.name in self.remote.same_models:
            return spec.name
        return self.remote.remote_model(spec.name)

    async def _embed(self, item: WorkItem, request: EmbeddingRequest, spec: ModelSpec) -> dict[str, Any]:
        # Ask for floats whatever the caller wants: we validate them, then encode as asked.
        payload = {**self._payload(item, spec), "encoding_format": "float"}
        data = await self.backend.post("embeddings", payload, give_up_at=item.deadline_at)
        parsed = _parse(_Embeddings, data, "embeddings")
        texts = request.texts()
        by_index = {d.index: d.embedding for d in parsed.data}
        if sorted(by_index) != list(range(len(texts))):
            raise RemoteBadResponse(f"remote returned {len(parsed.data)} embeddings for {len(texts)} inputs")
        vectors = [by_index[i] for i in range(len(texts))]
        tokens = parsed.usage.prompt_tokens or parsed.usage.total_tokens
        return embedding_body(self._reported_model(spec), vectors, tokens, request.encoding_format)

    async def _rerank(self, item: WorkItem, request: RerankRequest, spec: ModelSpec) -> dict[str, Any]:
        data = await self.backend.post("rerank", self._payload(item, spec), give_up_at=item.deadline_at)
        parsed = _parse(_Rerank, data, "rerank")
        n_docs = len(request.documents)
        if any(not 0 <= r.index < n_docs for r in parsed.results):
            raise RemoteBadResponse("remote rerank returned a document index out of range")
        scores = [(r.index, r.relevance_score) for r in parsed.results]
        return rerank_body(item.id, self._reported_model(spec), request, scores, parsed.usage.total_tokens)

    async def _chat(self, item: WorkItem, request: ChatRequest, spec: ModelSpec) -> dict[str, Any]:
        payload = self._payload(item, spec)
        payload.pop("max_completion_tokens", None)
        payload["max_tokens"] = chat_params(request, self.config.limits)["max_tokens"]
        data = await self.backend.post("chat/completions", payload, give_up_at=item.deadline_at)
        parsed = _parse(_Chat, data, "chat/completions")
        choice, usage = parsed.choices[0], parsed.usage
        out = ChatOutput(
            choice.message.content or "",
            choice.finish_reason or "stop",
            usage.prompt_tokens,
            usage.completion_tokens,
        )
        return chat_body(item.id, self._reported_model(spec), out)
