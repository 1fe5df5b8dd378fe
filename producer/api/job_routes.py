"""The job routes: ``POST /v1/jobs``, ``GET``/``DELETE /v1/jobs/{id}``, a job's webhook
delivery, and the tenants' webhook dead letters; and how a request finds its tenant."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from ..contract import (
    JobKind,
    JobOptions,
    JobResult,
    Status,
    TenantSpec,
)
from ..errors import (
    ApiError,
    Conflict,
    JobNotFound,
    JobTimeout,
    NotFound,
)
from .deadletters import job_delivery, list_dead_letters, replay
from .state import ApiState, checked_idempotency_key

# ---------------------------------------------------------------------------- models


class ApiJobOptions(JobOptions):
    """``options`` as the API takes them: the tenant comes from the API key, so the schema
    does not offer it (a request naming another tenant is refused, naming ``options.tenant``)."""

    tenant: SkipJsonSchema[str] = Field(default="default", min_length=1, max_length=128)


class JobSubmission(BaseModel):
    """``POST /v1/jobs``: the body is the OpenAI/Cohere request of the kind."""

    model_config = ConfigDict(extra="forbid")

    kind: JobKind
    body: dict[str, Any]
    options: ApiJobOptions = Field(default_factory=ApiJobOptions)


class JobAccepted(BaseModel):
    id: str
    object: str = "job"
    status: Status
    created_at: float


def _options(options: JobOptions, tenant: TenantSpec, idempotency_key: str | None) -> JobOptions:
    if "tenant" in options.model_fields_set and options.tenant != tenant.name:
        raise ApiError("options.tenant is set by the API key; leave it out", param="options.tenant")
    # Both given: the header wins, as HTTP's own place for it (and the one OpenAI's SDKs set).
    key = checked_idempotency_key(idempotency_key or options.idempotency_key)
    return options.model_copy(update={"tenant": tenant.name, "idempotency_key": key})


def _envelope(result: JobResult) -> dict[str, Any]:
    return result.model_dump(mode="json", exclude_none=True)


CANCEL_SETTLE_S = 5.0  # how long a cancel waits for a running chat job to stop


async def cancel_response(api: ApiState, job_id: str, tenant: str) -> JSONResponse:
    """What a cancel answers (``DELETE /v1/jobs/{id}``, the console's cancel)."""
    result = await api.client.cancel(job_id, tenant=tenant, settle_s=CANCEL_SETTLE_S)
    if result.status == Status.cancelled:
        return JSONResponse(_envelope(result))
    if result.status == Status.running and result.kind == JobKind.chat:
        return JSONResponse({**_envelope(result), "cancel_requested": True}, status_code=202)
    if result.status in (Status.queued, Status.running):
        raise Conflict(f"job {job_id} is running and cannot be cancelled; it will finish", code="job_running")
    raise Conflict(f"job {job_id} already {result.status.value}", code="job_finished")


# ---------------------------------------------------------------------------- routes

bearer = HTTPBearer(auto_error=False, description="An API key from the tenants file")


async def tenant_of(request: Request, _: Annotated[Any, Depends(bearer)]) -> TenantSpec:
    """Authenticate the request and charge it to its tenant's rate limit."""
    return await api_of(request).authenticate(request)


def api_of(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


Tenant = Annotated[TenantSpec, Depends(tenant_of)]
IdempotencyKey = Annotated[
    str | None, Header(alias="Idempotency-Key", description="Same key from the same tenant, same job")
]


def add_job_routes(app: FastAPI) -> None:
    @app.post("/v1/jobs", status_code=202, response_model=JobAccepted, tags=["jobs"])
    async def submit_job(
        submission: JobSubmission,
        request: Request,
        tenant: Tenant,
        idempotency_key: IdempotencyKey = None,
    ) -> JSONResponse:
        """Queue a job. The body is validated against the kind's schema before anything is queued."""
        api = api_of(request)
        options = _options(submission.options, tenant, idempotency_key)
        job_id = await api.submit(tenant, submission.kind, submission.body, options)
        try:
            result = await api.client.get(job_id, tenant=tenant.name)
            status, created = result.status, result.created_at
        except JobNotFound:  # an idempotent twin still being written
            status, created = Status.queued, time.time()
        accepted = JobAccepted(id=job_id, status=status, created_at=created)
        return JSONResponse(accepted.model_dump(mode="json"), status_code=202)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    async def get_job(
        job_id: str,
        request: Request,
        tenant: Tenant,
        wait: Annotated[float, Query(ge=0, le=3600, description="Long-poll up to this many seconds")] = 0.0,
    ) -> JSONResponse:
        """The job's result envelope. ``?wait=N`` blocks until it is terminal or N seconds pass."""
        api = api_of(request)
        timeout = min(wait, api.settings.max_wait_s)
        if timeout > 0:
            try:
                result = await api.client.wait(job_id, timeout, tenant=tenant.name)
            except JobTimeout:
                result = await api.client.get(job_id, tenant=tenant.name)
        else:
            result = await api.client.get(job_id, tenant=tenant.name)
        return JSONResponse(_envelope(result))

    @app.delete("/v1/jobs/{job_id}", tags=["jobs"])
    async def cancel_job(job_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        """Cancel a job: 200 with its cancelled envelope.

        A queued job is cancelled at once. A running chat job (streamed or not) is asked to
        stop: its generation ends within a step or two and the answer waits up to
        ``CANCEL_SETTLE_S`` for that (202 with ``cancel_requested`` if it is still running).
        A running job whose inputs still wait in a batcher has them taken out and is
        cancelled; one whose inputs are at the backend finishes: 409 ``job_running``; a
        finished one, 409 ``job_finished``.
        """
        return await cancel_response(api_of(request), job_id, tenant.name)

    @app.get("/v1/jobs/{job_id}/webhook", tags=["webhooks"])
    async def job_webhook(job_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        """The job's webhook delivery: state, attempts, last status and error."""
        api = api_of(request)
        await api.client.get(job_id, tenant=tenant.name)
        state = await job_delivery(api.redis, api.keys, job_id)
        if state is None:
            raise NotFound(f"job {job_id} has no webhook delivery (yet)", code="no_delivery")
        return JSONResponse({"job_id": job_id, **state})


def add_webhook_routes(app: FastAPI) -> None:
    @app.get("/v1/webhooks/dead-letters", tags=["webhooks"])
    async def dead_letters(
        request: Request,
        tenant: Tenant,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> JSONResponse:
        """Deliveries given up (refused URL, 4xx, 410, retries exhausted), most recent first."""
        api = api_of(request)
        letters = await list_dead_letters(api.redis, api.keys, tenant.name, limit)
        return JSONResponse({"object": "list", "data": [d.model_dump(mode="json") for d in letters]})

    @app.post("/v1/webhooks/dead-letters/{webhook_id}/replay", status_code=202, tags=["webhooks"])
    async def replay_dead_letter(webhook_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        """Queue a dead letter's delivery again: same ``webhook-id`` and body, a fresh schedule."""
        api = api_of(request)
        letter = await replay(api.redis, api.keys, tenant.name, webhook_id)
        body = {"webhook_id": webhook_id, "job_id": letter.delivery.job_id, "state": "pending"}
        return JSONResponse(body, status_code=202)
