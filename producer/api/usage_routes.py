"""``GET /v1/usage``: the usage ledger, per tenant × model × route × day.

A tenant's key reads its own rows; an admin key (``admin: true`` in the tenants file) reads
every tenant's, or one tenant's with ``?tenant=``. ``start`` and ``end`` are UTC days
(``YYYY-MM-DD``, inclusive); the default is this month so far. A period ending before it starts
is empty; a period over 400 days is read for its last 400 (the answer's ``start`` says which). ``?what_if=true`` adds the
what-if report (``producer.contract.what_if``): all-remote cost, all-local GPU-seconds, and
what cost-aware routing saved.
"""

# No ``from __future__ import annotations``: FastAPI must see the dependency built in
# usage_router as an object, not as a name it cannot resolve from this module's globals.
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from ..contract import (
    MEASURES,
    TenantSpec,
    UsageRow,
    days_between,
    last_days,
    month_so_far,
    parse_day,
    read_usage,
    what_if,
)
from ..errors import ApiError, Forbidden

TenantDependency = Callable[..., Awaitable[TenantSpec]]
MAX_DAYS = 400  # the longest period one request reads


def day_param(value: str | None, default: dt.date, param: str) -> dt.date:
    if value is None:
        return default
    try:
        return parse_day(value)
    except ValueError:
        raise ApiError(f"{param} is a UTC day, YYYY-MM-DD (got {value!r})", param=param) from None


def totals(rows: list[UsageRow]) -> dict[str, float]:
    out: dict[str, float] = dict.fromkeys(MEASURES, 0)
    for row in rows:
        for measure in MEASURES:
            out[measure] += getattr(row, measure)
    out["cost"] = round(out["cost"], 9)
    return out


def usage_router(tenant_of: TenantDependency) -> APIRouter:
    router = APIRouter(tags=["usage"])
    Tenant = Annotated[TenantSpec, Depends(tenant_of)]

    @router.get("/v1/usage")
    async def usage(
        request: Request,
        tenant: Tenant,
        start: Annotated[str | None, Query(description="first UTC day, YYYY-MM-DD")] = None,
        end: Annotated[str | None, Query(description="last UTC day, YYYY-MM-DD")] = None,
        of: Annotated[str | None, Query(alias="tenant", description="admin keys: one tenant")] = None,
        with_what_if: Annotated[
            bool, Query(alias="what_if", description="add the what-if report (and what cost routing saved)")
        ] = False,
    ) -> dict[str, Any]:
        first_default, last_default = month_so_far(time.time())
        first = day_param(start, first_default, "start")
        last = day_param(end, last_default, "end")
        # A period ending before it starts holds no day; a longer one than MAX_DAYS is read for
        # its last MAX_DAYS (the answer's ``start`` says so). Neither is refused: JSON Schema
        # cannot relate two parameters, and the document promises what it states.
        first = last_days(first, last, MAX_DAYS)
        days = days_between(first, last, max_days=MAX_DAYS) if first <= last else []
        if of is not None and of != tenant.name and not tenant.admin:
            raise Forbidden("only an admin key reads another tenant's usage", param="tenant")
        who = of if of is not None else (None if tenant.admin else tenant.name)
        api = request.app.state.api
        rows = await read_usage(api.redis, api.keys, days, who)
        doc: dict[str, Any] = {
            "object": "usage",
            "start": first.isoformat(),
            "end": last.isoformat(),
            "tenant": who,
            "data": [row.model_dump() for row in rows],
            "totals": totals(rows),
        }
        if with_what_if:
            doc["what_if"] = what_if(rows)
        return doc

    return router
