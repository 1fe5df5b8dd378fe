"""The live routing policy over HTTP, for admin keys only (``admin: true`` in the tenants file).

- ``GET /v1/admin/policy``: the policy stored in Redis (if any) and the one each live worker
  applies, with its source (``redis``, the policy file's path, or ``settings``);
- ``PUT /v1/admin/policy``: store a policy (JSON body, the fields of
  :class:`producer.contract.RoutingPolicy`); workers apply it within ``policy_refresh_s``.
  An invalid one is a 400 and nothing changes;
- ``DELETE /v1/admin/policy``: forget the stored policy; workers go back to their file.
"""

# No ``from __future__ import annotations``: FastAPI must see the dependency built in
# policy_router as an object, not as a name it cannot resolve from this module's globals.
import json
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ..contract import PolicyError, RoutingPolicy, TenantSpec, parse_policy, policy_json
from ..errors import ApiError, Forbidden

TenantDependency = Callable[..., Awaitable[TenantSpec]]


def _admin(tenant: TenantSpec) -> None:
    if not tenant.admin:
        raise Forbidden("the routing policy is for admin keys only")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def policy_router(tenant_of: TenantDependency) -> APIRouter:
    router = APIRouter(tags=["admin"])
    Tenant = Annotated[TenantSpec, Depends(tenant_of)]

    @router.get("/v1/admin/policy")
    async def get_policy(request: Request, tenant: Tenant) -> dict[str, Any]:
        _admin(tenant)
        api = request.app.state.api
        stored = await api.redis.get(api.keys.policy())
        published = await api.redis.hgetall(api.keys.policy_effective())
        now = time.time()
        workers = {}
        for worker, raw in published.items():
            doc = json.loads(raw)
            if doc.get("until", 0) >= now:
                workers[_text(worker)] = {"policy": doc["policy"], "source": doc["source"]}
        return {
            "object": "routing_policy",
            "stored": json.loads(policy_json(parse_policy(stored, "redis"))) if stored else None,
            "workers": workers,
        }

    # The body is read raw (a JSON object of RoutingPolicy's fields, refused as a whole with
    # param "body"), so the document is told what it takes.
    body = {"required": True, "content": {"application/json": {"schema": RoutingPolicy.model_json_schema()}}}

    @router.put("/v1/admin/policy", openapi_extra={"requestBody": body})
    async def put_policy(request: Request, tenant: Tenant) -> dict[str, Any]:
        _admin(tenant)
        raw = await request.body()
        try:
            json.loads(raw)
            policy = parse_policy(raw, "body")
        except (ValueError, PolicyError) as exc:
            raise ApiError(f"not a routing policy: {exc}", param="body") from None
        api = request.app.state.api
        await api.redis.set(api.keys.policy(), policy_json(policy))
        return {"object": "routing_policy", "stored": json.loads(policy_json(policy))}

    @router.delete("/v1/admin/policy")
    async def delete_policy(request: Request, tenant: Tenant) -> dict[str, Any]:
        _admin(tenant)
        api = request.app.state.api
        deleted = await api.redis.delete(api.keys.policy())
        return {"object": "routing_policy", "deleted": bool(deleted)}

    return router
