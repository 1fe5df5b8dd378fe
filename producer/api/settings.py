"""API server configuration: one pydantic-settings class, read from ``OVERSPILL_*`` variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..contract import Limits


class ApiSettings(BaseSettings):
    """Settings of ``producer.api``.

    Authentication fails closed: without a tenants file the server refuses to start, unless
    ``OVERSPILL_AUTH=off`` says on purpose that every request is tenant ``default`` with no
    API key (a laptop; the server binds loopback unless told otherwise).
    """

    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "overspill"
    host: str = "127.0.0.1"
    port: int = 8080
    tenants_file: Path | None = None
    auth: Literal["required", "off"] = "required"

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)  # larger → 413
    max_upload_bytes: int = Field(default=200 * 1024 * 1024, ge=1024)  # POST /v1/files (OpenAI: 200 MB)
    max_wait_s: float = Field(default=60.0, gt=0)  # cap of GET /v1/jobs/{id}?wait=
    sync_timeout_s: float = Field(default=120.0, gt=0, le=3600)  # /v1/embeddings & co. wait this long
    # An SSE response (streamed chat, job events) with no event for this long ends with an error
    # event; a streamed chat's job is then cancelled.
    stream_idle_timeout_s: float = Field(default=30.0, gt=0)
    result_ttl_s: int = 24 * 3600
    # On SIGTERM /readyz answers 503 this long while requests are still served, so a balancer
    # takes the API out before it stops listening; then in-flight requests finish.
    shutdown_drain_s: float = Field(default=2.0, ge=0)
    limits: Limits = Field(default_factory=Limits)

    log_level: str = "INFO"
    log_json: bool = True
    otel: bool = False  # FastAPI's native OpenTelemetry instrumentation, for a configured provider
