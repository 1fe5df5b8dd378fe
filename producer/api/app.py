"""HTTP API: submit jobs, read and cancel them, and OpenAI-compatible synchronous endpoints.

The API is a thin layer over :class:`producer.client.Client`, so it speaks the same contract
as every other producer: a job submitted here is the same record and work package as one
submitted from Python. Routes:

- ``POST /v1/jobs`` ``{kind, body, options}`` → 202 ``{id, status, created_at}``;
  ``GET /v1/jobs/{id}`` (``?wait=N`` long-polls, blocking on Redis); ``DELETE /v1/jobs/{id}``
  cancels a queued job and stops a running chat job (another running job is not interrupted:
  409 ``job_running``, it finishes);
  ``GET /v1/jobs/{id}/webhook`` is the job's callback delivery state; ``GET /v1/jobs/{id}/events``
  its events as server-sent events (``options.stream``: token deltas too; stream_routes.py).
- ``POST /v1/embeddings``, ``/v1/chat/completions``, ``/v1/rerank``: enqueue an interactive
  job, wait for it and answer with its OpenAI/Cohere body, so OpenAI SDKs work unchanged
  (the hot path: plain Starlette routes, see :mod:`producer.api.openai_routes`).
- ``GET /v1/webhooks/dead-letters`` and ``POST /v1/webhooks/dead-letters/{id}/replay``.
- ``/healthz`` (process up), ``/readyz`` (Redis reachable and Triton answering a worker),
  ``/metrics``, ``/docs``.

Every error, 4xx or 5xx, has the OpenAI shape ``{error: {message, type, param, code}}``.
Bad input of any kind is a 4xx; a 5xx means overspill itself (or its Redis) failed.
Run it with ``overspill api`` or ``python -m producer.api``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from ..batches import BatchSettings
from ..contract import Capability, configure_logging
from ..errors import (
    JobFailed,
)
from . import openai_routes
from .error_handlers import install_error_handlers
from .job_routes import add_job_routes, add_webhook_routes, api_of, tenant_of
from .middleware import Authenticate, BodyLimit, CrossSite, Observe
from .schema import tighten
from .settings import ApiSettings
from .state import ApiState
from .tenant_metrics import TENANT_LOAD
from .tenants import TenantRegistry

log = structlog.get_logger("producer.api")


def _add_ops_routes(app: FastAPI) -> None:
    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"])
    async def readyz(request: Request) -> JSONResponse:
        """Ready when Redis answers and a worker reported lately that Triton answers it (503
        ``not_ready`` otherwise, ``down`` naming the part); ``/healthz`` is liveness only."""
        if getattr(request.app.state, "draining", False):
            return _not_ready("shutting down", "api")
        api = api_of(request)
        try:
            await api.redis.ping()
            reports = await api.redis.hgetall(api.keys.readiness())
        except (RedisError, OSError) as exc:
            return _not_ready(f"redis unreachable: {type(exc).__name__}", "redis")
        current = [
            r["triton_ready"] for r in map(_report, reports.values()) if r and r["until"] > time.time()
        ]
        if not reports or any(current):
            # No report at all: no worker ever ran on this prefix (an API started first, or
            # alone), so there is nothing to judge Triton by.
            return JSONResponse({"status": "ready"})
        if current:
            return _not_ready("no worker reaches Triton", "triton")
        return _not_ready("no worker has reported lately", "workers")

    @app.get(
        "/metrics",
        tags=["ops"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
    )
    async def metrics(request: Request) -> Response:
        api = api_of(request)
        await TENANT_LOAD.refresh(api.redis, api.keys)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def _report(raw: str) -> dict[str, Any] | None:
    """A worker's readiness report (see ``Keys.readiness``), or None if unreadable."""
    try:
        record = json.loads(raw)
        return {"triton_ready": bool(record["triton_ready"]), "until": float(record["until"])}
    except (ValueError, KeyError, TypeError):
        return None


def _not_ready(message: str, down: str) -> JSONResponse:
    body = {**JobFailed(message, code="not_ready").body(), "down": [down]}
    return JSONResponse(body, status_code=503)


# ---------------------------------------------------------------------------- app


def _drain_on_sigterm(app: FastAPI, drain_s: float) -> None:
    """SIGTERM: /readyz turns 503 at once; ``drain_s`` later the server's own handler runs
    (uvicorn stops listening, lets in-flight requests finish, then the lifespan closes)."""
    server_handler = signal.getsignal(signal.SIGTERM)
    if not callable(server_handler):
        return  # not under a server that handles SIGTERM (e.g. an in-process test client)
    loop = asyncio.get_running_loop()

    def begin() -> None:
        app.state.draining = True
        log.info("api draining", drain_s=drain_s)
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, server_handler)  # a second SIGTERM stops at once
        loop.call_later(drain_s, server_handler, signal.SIGTERM, None)

    try:
        loop.add_signal_handler(signal.SIGTERM, begin)
    except (ValueError, RuntimeError):  # not the main thread: no signals here
        return


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    """Build the app; the tenants file is read now, so a broken one fails at start."""
    settings = settings or ApiSettings()
    if settings.tenants_file is None and settings.auth != "off":
        raise ValueError("no tenants file: set OVERSPILL_TENANTS_FILE, or OVERSPILL_AUTH=off")
    tenants = TenantRegistry(settings.tenants_file)
    if tenants.open:
        log.warning("no tenants file: authentication is off, every request is tenant 'default'")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.api = ApiState(settings, tenants)
        try:
            await app.state.api.models.refresh()  # so the first OpenAPI document knows the catalogue
        except RedisError as exc:
            log.warning("model catalogue not read at start", error=str(exc))
        gc.freeze()  # start-up objects live as long as the process: keep collections short
        _drain_on_sigterm(app, settings.shutdown_drain_s)
        try:
            yield
        finally:
            await app.state.api.client.aclose()

    app = FastAPI(
        title="overspill",
        version="1",
        summary="Queue-driven batch inference: jobs, OpenAI-compatible endpoints, webhooks",
        lifespan=lifespan,
        **_telemetry(settings.otel),
    )
    install_error_handlers(app)
    add_job_routes(app)
    add_webhook_routes(app)
    # First in the routing table: the hot path should not be matched against every other route.
    app.router.routes[0:0] = openai_routes.routes()
    _add_ops_routes(app)
    # Batches (batch_routes.py): OpenAI Batch-compatible /v1/files and /v1/batches.
    from .batch_routes import batches_router

    app.include_router(batches_router(settings, tenant_of))
    from .usage_routes import usage_router

    app.include_router(usage_router(tenant_of))
    from .policy_routes import policy_router

    app.include_router(policy_router(tenant_of))
    from .stream_routes import stream_router

    app.include_router(stream_router(tenant_of))
    from .console import console_router

    app.include_router(console_router(tenant_of))
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, upload_paths={"/v1/files": settings.max_upload_bytes}
    )
    app.add_middleware(Authenticate, registry=tenants)  # before any body is read
    app.add_middleware(CrossSite)  # before authentication: a forged request is refused unread
    app.add_middleware(Observe)

    documented: list[frozenset[Capability]] = []  # the features the cached document states

    def openapi() -> dict[str, Any]:
        # The features a request may ask for are those the catalogue last read offers: the
        # document is rebuilt when they change (a worker with a remote came up, say).
        api = getattr(app.state, "api", None)
        offered = api.models.offered() if api is not None else frozenset()
        if app.openapi_schema is None or documented != [offered]:
            app.openapi_schema = None
            document = document_errors(openai_routes.add_openapi_paths(FastAPI.openapi(app)))
            batches = BatchSettings(redis_url=settings.redis_url, prefix=settings.prefix)
            app.openapi_schema = tighten(document, settings.limits, batches, offered)
            documented[:] = [offered]
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Every operation's errors as the API answers them: any 4xx, and 503 when the store is
    down, all in OpenAI's error shape; FastAPI's 422 is never sent (a bad request is a 400)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses["4XX"] = {"description": "An OpenAI-shaped error", **error}
            responses["503"] = {"description": "The job store is unavailable; retry", **error}
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    return schema


def _telemetry(enabled: bool) -> dict[str, Any]:
    """FastAPI's native OpenTelemetry switches (FastAPI >= 0.165), off unless asked for: it checks
    for configured providers on every request, and Prometheus metrics and JSON logs are built in."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": enabled, "metrics": enabled, "logs": enabled}}


def main(argv: list[str] | None = None) -> None:
    """``python -m producer.api [--host H] [--port P]``: flags win over ``OVERSPILL_HOST/PORT``."""
    parser = argparse.ArgumentParser(prog="python -m producer.api", description="The overspill HTTP API")
    parser.add_argument("--host", help="address to bind (OVERSPILL_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (OVERSPILL_PORT, default 8080)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = ApiSettings(**overrides)
    configure_logging(settings.log_level, settings.log_json)
    if settings.tenants_file is None and settings.auth != "off":
        parser.exit(
            2,
            "overspill api: no tenants file, so no API key could be checked. Set OVERSPILL_TENANTS_FILE "
            "(see `overspill api-key`), or OVERSPILL_AUTH=off to serve every request without a key.\n",
        )
    app = create_app(settings)
    log.info("api starting", host=settings.host, port=settings.port, prefix=settings.prefix)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        server_header=False,
        lifespan="on",
    )
