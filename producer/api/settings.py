"""API server configuration: one pydantic-settings class, read from ``OVERSPILL_*`` variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..contract import Limits


class ApiSettings(BaseSettings):
    """Settings of ``producer.api``.

    Without a tenants file every request is served as tenant ``default`` with no API key:
    meant for a laptop, which is why the server binds loopback unless told otherwise.
    """

    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "overspill"
    host: str = "127.0.0.1"
    port: int = 8080
    tenants_file: Path | None = None

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)  # larger → 413
    max_upload_bytes: int = Field(default=200 * 1024 * 1024, ge=1024)  # POST /v1/files (OpenAI: 200 MB)
    max_wait_s: float = Field(default=60.0, gt=0)  # cap of GET /v1/jobs/{id}?wait=
    sync_timeout_s: float = Field(default=120.0, gt=0, le=3600)  # /v1/embeddings & co. wait this long
    result_ttl_s: int = 24 * 3600
    limits: Limits = Field(default_factory=Limits)

    log_level: str = "INFO"
    log_json: bool = True
    otel: bool = False  # FastAPI's native OpenTelemetry instrumentation, for a configured provider
