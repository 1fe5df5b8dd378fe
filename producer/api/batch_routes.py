"""OpenAI Batch-compatible routes: ``/v1/files`` and ``/v1/batches``, as a FastAPI router.

Included by the HTTP API (``producer.api``) with ``app.include_router(batches_router(...))``.
The router brings its own lifespan: a :class:`~producer.batches.BatchEngine` with its own
:class:`~producer.client.Client` (packing ``batch_pack_size`` items per arq job) and the
background :class:`~producer.batches.BatchDriver` that moves batches along.

- ``POST /v1/files`` (multipart: ``file``, ``purpose=batch``, optional
  ``expires_after[anchor]=created_at`` + ``expires_after[seconds]``) → the file object;
  ``GET /v1/files?limit=&after=&purpose=&order=``; ``GET /v1/files/{id}``;
  ``GET /v1/files/{id}/content`` (streamed from disk); ``DELETE /v1/files/{id}`` (409 while an
  active batch reads it). Uploads count against the tenant's ``max_file_bytes_total``; expired
  files are deleted by a :class:`~producer.batches.sweep.FileSweeper` in the same lifespan.
- ``POST /v1/batches`` ``{input_file_id, endpoint, completion_window, metadata}``;
  ``GET /v1/batches/{id}``; ``GET /v1/batches?limit=&after=``; ``POST /v1/batches/{id}/cancel``.

Endpoints a batch may target: ``/v1/embeddings``, ``/v1/chat/completions``, ``/v1/rerank``.
A tenant sees only its own files and batches: anyone else's id is a 404, as an unknown one.
Errors are raised as :class:`producer.errors.ApiError` and rendered by the app in the OpenAI
shape ``{error: {message, type, param, code}}``.
"""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import structlog
from fastapi import APIRouter, Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict

from ..batches import CHUNK_BYTES, BatchDriver, BatchEngine, BatchSettings
from ..batches.files import MAX_EXPIRY_S
from ..batches.sweep import FileSweeper
from ..client import Client
from ..contract import TenantSpec
from ..errors import ApiError
from .settings import ApiSettings

log = structlog.get_logger("producer.api")

TenantDependency = Callable[..., Awaitable[TenantSpec]]


class BatchCreate(BaseModel):
    """``POST /v1/batches``. Unknown fields are ignored, as OpenAI SDKs add optional ones."""

    model_config = ConfigDict(extra="ignore")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None = None


class BatchService:
    """What the routes share, on ``app.state.batches``."""

    def __init__(self, engine: BatchEngine, driver: BatchDriver) -> None:
        self.engine = engine
        self.driver = driver


def _service(request: Request) -> BatchService:
    service: BatchService = request.app.state.batches
    return service


async def _upload_chunks(upload: UploadFile | str) -> AsyncIterator[bytes]:
    if isinstance(upload, str):  # a text part without a file name: its text is the content
        data = upload.encode()
        for start in range(0, len(data), CHUNK_BYTES):
            yield data[start : start + CHUNK_BYTES]
        return
    while chunk := await upload.read(CHUNK_BYTES):
        yield chunk


ANCHOR, SECONDS = "expires_after[anchor]", "expires_after[seconds]"


def _as_sent(form: Any, name: str, parsed: str | None) -> str | None:
    """A form field's value as the client sent it: "" stays "" (refused, not absent), and a
    file part under that name holds no text."""
    if name not in form:
        return parsed
    value = form.get(name)
    return value if isinstance(value, str) else ""


def expires_after_s(anchor: str | None, seconds: str | None, minimum: int) -> int | None:
    """OpenAI's ``expires_after`` of an upload, in seconds after creation; None if not given."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise ApiError(
            "expires_after[anchor] must be 'created_at'", param="expires_after.anchor", code="invalid_value"
        )
    try:
        value = int(seconds or "")
    except ValueError:
        value = -1
    if not minimum <= value <= MAX_EXPIRY_S:
        raise ApiError(
            f"expires_after[seconds] must be an integer between {minimum} and {MAX_EXPIRY_S}",
            param="expires_after.seconds",
            code="invalid_value",
        )
    return value


def batches_router(
    api_settings: ApiSettings, tenant_dependency: TenantDependency, settings: BatchSettings | None = None
) -> APIRouter:
    """The router; ``tenant_dependency`` authenticates a request and returns its tenant."""
    batch_settings = settings or BatchSettings(redis_url=api_settings.redis_url, prefix=api_settings.prefix)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = Client(
            batch_settings.redis_url,
            prefix=batch_settings.prefix,
            limits=api_settings.limits,
            pack_size=batch_settings.batch_pack_size,
            chunk_size=batch_settings.batch_pack_size,
            result_ttl_s=api_settings.result_ttl_s,
            coalesce_window_ms=None,
        )
        engine = BatchEngine(batch_settings, client, api_settings.limits)
        driver = BatchDriver(engine)
        driver.start()
        sweeper = FileSweeper(engine.files, batch_settings.file_sweep_s, batch_settings.file_sweep_batch)
        sweeper.start()
        app.state.batches = BatchService(engine, driver)
        log.info("batches ready", files_dir=str(batch_settings.directory()))
        try:
            yield
        finally:
            await sweeper.aclose()
            await driver.aclose()
            await client.aclose()

    router = APIRouter(lifespan=lifespan, tags=["batches"])
    Tenant = Annotated[TenantSpec, Depends(tenant_dependency)]
    _add_file_routes(router, Tenant, batch_settings.file_expiry_min_s)
    _add_batch_routes(router, Tenant)
    return router


def _add_file_routes(router: APIRouter, Tenant: Any, min_expiry_s: int) -> None:  # noqa: N803  # a type alias
    @router.post("/v1/files")
    async def create_file(
        request: Request,
        tenant: Tenant,
        file: Annotated[UploadFile | str, File(description="The JSONL input of a batch")],
        purpose: Annotated[str, Form()],
        anchor: Annotated[str | None, Form(alias=ANCHOR)] = None,
        seconds: Annotated[str | None, Form(alias=SECONDS)] = None,
    ) -> JSONResponse:
        """Upload a batch input file (``purpose=batch``); copied to the file store in chunks."""
        if purpose != "batch":
            raise ApiError("purpose must be 'batch'", param="purpose", code="invalid_value")
        # FastAPI reads an empty optional form field as absent; "expires_after[anchor]=" alone
        # was sent, and is refused, so the fields are taken as sent (the form is parsed once).
        form = await request.form()
        if len(form.getlist("file")) != 1:
            raise ApiError("file: send one file part", param="file", code="invalid_value")
        expiry = expires_after_s(
            _as_sent(form, ANCHOR, anchor), _as_sent(form, SECONDS, seconds), min_expiry_s
        )
        engine = _service(request).engine
        record = await engine.files.save_upload(
            tenant.name,
            (None if isinstance(file, str) else file.filename) or "upload.jsonl",
            "batch",
            _upload_chunks(file),
            quota=tenant.max_file_bytes_total,
            expires_after_s=expiry,
        )
        log.info("file uploaded", file_id=record.id, bytes=record.bytes, expires_at=record.expires_at)
        return JSONResponse(record.public())

    @router.get("/v1/files")
    async def list_files(
        request: Request,
        tenant: Tenant,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,  # OpenAI's bounds and default
        after: Annotated[str | None, Query(max_length=200)] = None,
        purpose: Annotated[str | None, Query(max_length=64)] = None,
        order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    ) -> JSONResponse:
        """The tenant's files, newest first unless ``order=asc``; ``after`` is the previous page's last id."""
        files = _service(request).engine.files
        return JSONResponse(
            await files.list(tenant.name, limit, after, purpose, newest_first=order == "desc")
        )

    @router.delete("/v1/files/{file_id}")
    async def delete_file(file_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        """Delete the record and the bytes; 409 while an active batch reads the file."""
        await _service(request).engine.files.delete(tenant.name, file_id)
        log.info("file deleted", file_id=file_id)
        return JSONResponse({"id": file_id, "object": "file", "deleted": True})

    @router.get("/v1/files/{file_id}")
    async def get_file(file_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        record = await _service(request).engine.files.get(tenant.name, file_id)
        return JSONResponse(record.public())

    @router.get(
        "/v1/files/{file_id}/content",
        response_class=FileResponse,
        responses={200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes"}},
    )
    async def file_content(file_id: str, request: Request, tenant: Tenant) -> FileResponse:
        """The file's bytes, streamed from the file store."""
        files = _service(request).engine.files
        record = await files.get(tenant.name, file_id)
        return FileResponse(
            files.path(record.id), media_type="application/octet-stream", filename=record.filename
        )


def _add_batch_routes(router: APIRouter, Tenant: Any) -> None:  # noqa: N803  # a type alias
    @router.post("/v1/batches")
    async def create_batch(body: BatchCreate, request: Request, tenant: Tenant) -> JSONResponse:
        service = _service(request)
        batch = await service.engine.create(
            tenant.name, body.input_file_id, body.endpoint, body.completion_window, body.metadata
        )
        service.driver.poke()
        return JSONResponse(batch)

    @router.get("/v1/batches/{batch_id}")
    async def get_batch(batch_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        """The batch; asking also wakes the driver, so progress is at most a step behind."""
        service = _service(request)
        batch = await service.engine.get(tenant.name, batch_id)
        service.driver.poke()
        return JSONResponse(batch)

    @router.get("/v1/batches")
    async def list_batches(
        request: Request,
        tenant: Tenant,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        after: Annotated[str | None, Query(max_length=200)] = None,
    ) -> JSONResponse:
        """The tenant's batches, newest first; ``after`` is the last id of the previous page."""
        return JSONResponse(await _service(request).engine.list(tenant.name, limit, after))

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        """``cancelling`` now; ``cancelled`` once running jobs are done. Results so far are kept."""
        service = _service(request)
        batch = await service.engine.cancel(tenant.name, batch_id)
        service.driver.poke()
        return JSONResponse(batch)
