"""ASGI middleware of the HTTP API: early authentication, a request-body size limit, and
per-request logs and metrics."""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import structlog
from fastapi.responses import JSONResponse
from prometheus_client import Counter, Histogram

from ..errors import Forbidden, PayloadTooLarge, Unauthorized

log = structlog.get_logger("producer.api")

TENANT_STATE = "tenant"  # where Authenticate leaves the request's tenant in ``request.state``

REQUESTS = Counter("overspill_api_requests_total", "API requests", ["method", "route", "status"])
LATENCY = Histogram(
    "overspill_api_request_seconds",
    "API request duration",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Authenticate:
    """Refuse a request to ``/v1/`` without a valid API key before its body is read.

    FastAPI reads (and parses) a body before it runs the route's dependencies, so without this a
    stranger's 100 MB upload would be read in full before its 401. The route's own dependency
    still charges the rate limit, with the tenant found here (the key is hashed once).
    """

    def __init__(self, app: ASGIApp, registry: Any) -> None:
        self.app = app
        self.registry = registry  # the API's TenantRegistry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith("/v1/") and not self.registry.open:
            header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
            try:
                tenant = self.registry.authenticate(header.decode("latin-1") if header is not None else None)
            except Unauthorized as exc:
                headers = {**exc.headers(), "Connection": "close"}  # the unread body stays unread
                await JSONResponse(exc.body(), status_code=exc.status, headers=headers)(scope, receive, send)
                return
            scope.setdefault("state", {})[TENANT_STATE] = tenant  # the route's ``request.state``
        await self.app(scope, receive, send)


class CrossSite:
    """Refuse a state-changing request sent by a page of another origin (403 ``cross_site``).

    Browsers name the page's origin in ``Origin`` on every cross-origin POST, PUT, PATCH and
    DELETE; SDKs, curl and servers send none, so they pass. The console's own requests come
    from the API's origin. (Its key travels in a header only a script of that origin sets, so
    a forged form carries no credential either: this is the second wall.)
    """

    SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") not in self.SAFE:
            headers = dict(scope.get("headers", ()))
            origin = headers.get(b"origin")
            if origin is not None and not _same_origin(origin, headers.get(b"host")):
                exc = Forbidden(
                    "cross-site request refused: send it from the API's own origin", code="cross_site"
                )
                await JSONResponse(exc.body(), status_code=exc.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether ``Origin`` names the host the request was sent to. Only host and port are
    compared: behind a TLS-terminating proxy the page is https and the hop to us is http."""
    netloc = origin.decode("latin-1").partition("://")[2].lower()
    return host is not None and netloc == host.decode("latin-1").lower()


class BodyLimit:
    """Answer 413 to a request body over ``max_bytes`` (declared or streamed)."""

    DRAIN_LIMIT = 64 * 1024 * 1024  # read and drop up to this much so the client sees the 413

    def __init__(self, app: ASGIApp, max_bytes: int, upload_paths: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        # Uploads (batch input files) have their own, larger limit and are streamed, not buffered.
        self.upload_paths = upload_paths or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("method") == "POST" and scope.get("path") in self.upload_paths:
            await self._stream_upload(scope, receive, send, self.upload_paths[scope["path"]])
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            if declared <= self.DRAIN_LIMIT:
                await _drain(receive, self.DRAIN_LIMIT)
            await self._reject(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message.get("more_body"):
                    await _drain(receive, self.DRAIN_LIMIT)
                await self._reject(send)
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay_body() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay_body, send)

    async def _stream_upload(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._reject(send, limit)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:  # an undeclared (chunked) upload past the limit: cut it off
                return {"type": "http.disconnect"}
            return message

        await self.app(scope, counted, send)

    async def _reject(self, send: Send, limit: int | None = None) -> None:
        err = PayloadTooLarge(
            f"request body exceeds {limit or self.max_bytes} bytes", code="request_too_large", param="body"
        )
        await JSONResponse(err.body(), status_code=err.status, headers={"Connection": "close"})(
            {"type": "http"}, _no_receive, send
        )


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


async def _drain(receive: Receive, limit: int) -> None:
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body"):
            return


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class Observe:
    """One log line and metrics per request; clears per-request log context.

    Every response carries an ``x-request-id`` (the openai SDK's ``request_id``), also logged.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        structlog.contextvars.clear_contextvars()
        request_id = "req_" + secrets.token_hex(12)
        structlog.contextvars.bind_contextvars(request_id=request_id)
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            elapsed = time.perf_counter() - started
            REQUESTS.labels(scope["method"], route, str(status)).inc()
            LATENCY.labels(route).observe(elapsed)
            (log.warning if status >= 500 else log.info)(
                "request",
                method=scope["method"],
                path=scope["path"],
                status=status,
                ms=round(elapsed * 1000, 1),
            )
