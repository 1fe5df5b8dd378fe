"""The console's lists of jobs, batches and dead letters: bounded reads of the indexes the
system keeps, scoped to what the viewer may see.

Jobs are listed from each tenant's open-jobs index (``Keys.open_jobs``: the jobs submitted over
the API, newest first, until they are pruned); any job, from any producer, is found by id.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ...contract import TERMINAL, JobResult, Keys, TenantSpec, valid_id
from ...errors import Forbidden, NotFound

JOB_SCAN = 200  # entries of a tenant's index read per listing, whatever its length
FIELDS = ("status", "kind", "tenant", "lane", "created_at", "attempts")


def as_text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def scope(viewer: TenantSpec, asked: str | None, tenants: list[TenantSpec]) -> list[str]:
    """The tenants a listing covers: the viewer's own, or for an admin one or all of them."""
    names = [t.name for t in tenants]
    if not viewer.admin:
        if asked not in (None, "", viewer.name):
            raise Forbidden("only an admin key sees another tenant", param="tenant")
        return [viewer.name]
    if asked:
        if asked not in names:
            raise NotFound(f"no tenant named {asked!r}", param="tenant")
        return [asked]
    return names


async def newest(
    tenants: list[str], fetch: Callable[[str], Awaitable[list[dict[str, Any]]]], key: str, limit: int
) -> dict[str, Any]:
    """Each tenant's rows (``fetch``), marked with their tenant, newest first by ``key``, cut to
    ``limit``: a console list across the tenants a viewer may see."""
    rows = [{**row, "tenant": name} for name in tenants for row in await fetch(name)]
    rows.sort(key=lambda row: row.get(key, 0), reverse=True)
    return {"object": "list", "data": rows[:limit]}


async def list_jobs(
    redis: Any, keys: Keys, tenants: list[str], status: str | None, lane: str | None, limit: int
) -> list[dict[str, Any]]:
    """The newest API jobs of ``tenants`` (at most ``JOB_SCAN`` looked at per tenant), filtered."""
    async with redis.pipeline(transaction=False) as pipe:
        for name in tenants:
            pipe.zrevrange(keys.open_jobs(name), 0, JOB_SCAN - 1, withscores=True)
        indexes = await pipe.execute()
    entries = sorted(
        (
            (float(at), as_text(job_id))
            for index in indexes
            for job_id, at in index
            if valid_id(as_text(job_id) or "")
        ),
        reverse=True,
    )[:JOB_SCAN]
    async with redis.pipeline(transaction=False) as pipe:
        for _, job_id in entries:
            pipe.hmget(keys.job(job_id), list(FIELDS))
        records = await pipe.execute()
    rows = []
    for (_, job_id), values in zip(entries, records, strict=True):
        record = dict(zip(FIELDS, map(as_text, values), strict=True))
        if record["status"] is None or record["tenant"] not in tenants:
            continue  # expired, or an index entry that does not name a job of these tenants
        if (status and record["status"] != status) or (lane and record["lane"] != lane):
            continue
        rows.append({"id": job_id, **record, "done": record["status"] in TERMINAL})
        if len(rows) >= limit:
            break
    return rows


def job_detail(result: JobResult, lane: str | None, delivery: dict[str, Any] | None) -> dict[str, Any]:
    """A job as the console shows it: the envelope (vectors summarised), lane and webhook."""
    envelope = result.model_dump(mode="json", exclude_none=True)
    body = envelope.get("body")
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        data = body["data"]
        shown = [_summarised(item) for item in data[:20]]
        envelope["body"] = {**body, "data": shown, "data_items": len(data)}
    return {"object": "console.job", "envelope": envelope, "lane": lane, "webhook": delivery}


def _summarised(item: Any) -> Any:
    """An embedding row with its vector cut to 8 numbers: a page shows a vector's shape, not it."""
    if isinstance(item, dict) and isinstance(item.get("embedding"), list):
        vector = item["embedding"]
        return {**item, "embedding": vector[:8], "dimensions": len(vector)}
    return item
