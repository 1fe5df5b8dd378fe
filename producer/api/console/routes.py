"""``GET /console``: the operations console, a static page served by the API itself, and the
``/v1/console/*`` reads and actions it calls with the viewer's API key.

The page holds no data: its script asks for the key, keeps it in the tab's ``sessionStorage``
and sends it as ``Authorization: Bearer``, so a cross-site form or link carries no credential
(and the ``CrossSite`` middleware refuses any state-changing request from another origin).
An admin key (``admin: true`` in the tenants file) sees every tenant; a tenant's key only its
own jobs, batches and dead letters, another's being a 404 as an unknown id. Without a tenants
file (``OVERSPILL_AUTH=off``, as ``overspill up`` runs on a laptop) the one operator is admin.
"""

# No ``from __future__ import annotations``: FastAPI resolves the dependency types at runtime.
from collections.abc import Awaitable, Callable
from importlib.resources import files
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from ...contract import Status, TenantSpec, valid_id
from ...errors import NotFound
from ..deadletters import job_delivery, list_dead_letters, replay
from ..job_routes import cancel_response
from .listings import job_detail, list_jobs, newest, scope
from .overview import read_overview

TenantDependency = Callable[..., Awaitable[TenantSpec]]
STATIC = files(__package__) / "static"
ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
# The page loads only its own script and style; nothing may frame it (clickjacking).
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(name: str, media_type: str) -> Response:
    return Response((STATIC / name).read_bytes(), media_type=media_type, headers=HEADERS)


def console_router(tenant_of: TenantDependency) -> APIRouter:
    router = APIRouter(tags=["console"])

    async def viewer_of(request: Request, tenant: Annotated[TenantSpec, Depends(tenant_of)]) -> TenantSpec:
        if request.app.state.api.tenants.open:
            return tenant.model_copy(update={"admin": True})
        return tenant

    Viewer = Annotated[TenantSpec, Depends(viewer_of)]

    @router.get("/console", include_in_schema=False)
    async def page() -> Response:
        return _asset("index.html", "text/html; charset=utf-8")

    @router.get("/console/static/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise NotFound(f"no console asset {name!r}")
        return _asset(name, ASSETS[name])

    @router.get("/v1/console/me")
    async def me(request: Request, viewer: Viewer) -> dict[str, Any]:
        """Who the key is: the console shows an admin every tenant, a tenant only itself."""
        api = request.app.state.api
        tenants = [t.name for t in api.tenants.all()] if viewer.admin else [viewer.name]
        return {
            "tenant": viewer.name,
            "admin": viewer.admin,
            "auth": not api.tenants.open,
            "tenants": tenants,
        }

    @router.get("/v1/console/overview")
    async def overview(request: Request, viewer: Viewer) -> dict[str, Any]:
        """Lanes, route split and items/s; for admins also gates, replicas, providers, workers, budgets."""
        api = request.app.state.api
        return await read_overview(api.redis, api.keys, viewer, api.tenants.all())

    _add_job_routes(router, Viewer)
    _add_batch_routes(router, Viewer)
    _add_letter_routes(router, Viewer)
    return router


def _add_job_routes(router: APIRouter, Viewer: Any) -> None:  # noqa: N803  # a type alias
    @router.get("/v1/console/jobs")
    async def jobs(
        request: Request,
        viewer: Viewer,
        tenant: Annotated[str | None, Query(max_length=128)] = None,
        status: Status | None = None,
        lane: Annotated[str | None, Query(pattern="^(interactive|bulk)$")] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
    ) -> dict[str, Any]:
        """The newest jobs submitted over the API, of one tenant or (admin) all, filtered."""
        api = request.app.state.api
        names = scope(viewer, tenant, api.tenants.all())
        rows = await list_jobs(api.redis, api.keys, names, status.value if status else None, lane, limit)
        return {"object": "list", "data": rows}

    @router.get("/v1/console/jobs/{job_id}")
    async def job(job_id: str, request: Request, viewer: Viewer) -> dict[str, Any]:
        """One job: envelope, timings, route and reason, attempts, lane, webhook delivery."""
        api = request.app.state.api
        result = await api.client.get(job_id, tenant=None if viewer.admin else viewer.name)
        lane = await api.redis.hget(
            api.keys.job(job_id), "lane"
        )  # a bulk chunk's jobs have none of their own
        delivery = await job_delivery(api.redis, api.keys, job_id)
        return job_detail(result, lane.decode() if isinstance(lane, bytes) else lane, delivery)

    @router.post("/v1/console/jobs/{job_id}/cancel")
    async def cancel_job(job_id: str, request: Request, viewer: Viewer) -> JSONResponse:
        """Cancel a job, as ``DELETE /v1/jobs/{id}`` does (a running chat job is asked to stop)."""
        api = request.app.state.api
        owner = (await api.client.get(job_id, tenant=None if viewer.admin else viewer.name)).tenant
        return await cancel_response(api, job_id, owner)


async def _batch_owner(request: Request, viewer: TenantSpec, batch_id: str) -> str:
    """The batch's tenant, if the viewer may see it; a 404 as for an unknown id otherwise."""
    state = await request.app.state.batches.engine.load(batch_id) if valid_id(batch_id) else None
    if state is None or (not viewer.admin and state.tenant != viewer.name):
        raise NotFound(f"No batch found with id '{batch_id}'.", code="batch_not_found", param="batch_id")
    return str(state.tenant)


def _add_batch_routes(router: APIRouter, Viewer: Any) -> None:  # noqa: N803  # a type alias
    @router.get("/v1/console/batches")
    async def batches(
        request: Request,
        viewer: Viewer,
        tenant: Annotated[str | None, Query(max_length=128)] = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
    ) -> dict[str, Any]:
        """The newest batches of one tenant or (admin) all, with counts and timestamps."""
        engine = request.app.state.batches.engine

        async def page(name: str) -> list[dict[str, Any]]:
            return list((await engine.list(name, limit))["data"])

        return await newest(
            scope(viewer, tenant, request.app.state.api.tenants.all()), page, "created_at", limit
        )

    @router.get("/v1/console/batches/{batch_id}")
    async def batch(batch_id: str, request: Request, viewer: Viewer) -> dict[str, Any]:
        owner = await _batch_owner(request, viewer, batch_id)
        service = request.app.state.batches
        service.driver.poke()
        return {**await service.engine.get(owner, batch_id), "tenant": owner}

    @router.post("/v1/console/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str, request: Request, viewer: Viewer) -> dict[str, Any]:
        """``cancelling`` now, ``cancelled`` once its running jobs are done (as the Batch API)."""
        owner = await _batch_owner(request, viewer, batch_id)
        service = request.app.state.batches
        state = await service.engine.cancel(owner, batch_id)
        service.driver.poke()
        return {**state, "tenant": owner}


def _add_letter_routes(router: APIRouter, Viewer: Any) -> None:  # noqa: N803  # a type alias
    @router.get("/v1/console/dead-letters")
    async def letters(
        request: Request,
        viewer: Viewer,
        tenant: Annotated[str | None, Query(max_length=128)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
    ) -> dict[str, Any]:
        """Webhook deliveries given up, per tenant, most recent first (URLs without credentials)."""
        api = request.app.state.api

        async def found(name: str) -> list[dict[str, Any]]:
            letters = await list_dead_letters(api.redis, api.keys, name, limit)
            return [d.model_dump(mode="json", exclude={"delivery": {"body"}}) for d in letters]

        return await newest(scope(viewer, tenant, api.tenants.all()), found, "failed_at", limit)

    @router.post("/v1/console/dead-letters/{webhook_id}/replay")
    async def replay_letter(
        webhook_id: str,
        request: Request,
        viewer: Viewer,
        tenant: Annotated[str | None, Query(max_length=128)] = None,
    ) -> JSONResponse:
        """Queue a dead letter's delivery again (same ``webhook-id`` and body, a fresh schedule)."""
        api = request.app.state.api
        (name,) = scope(viewer, tenant or viewer.name, api.tenants.all())
        letter = await replay(api.redis, api.keys, name, webhook_id)
        body = {
            "webhook_id": webhook_id,
            "job_id": letter.delivery.job_id,
            "state": "pending",
            "tenant": name,
        }
        return JSONResponse(body, status_code=202)
