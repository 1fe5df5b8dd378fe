"""The console's overview, read in a bounded number of Redis commands whatever the backlog.

Per lane: ``ZCARD`` of its queue and the first entry (the oldest package), O(log n); the
route split and items/s from the last ``SLICES`` activity slices the workers write
(``workers/app/status.py``); everything else from the workers' status reports, one ``HGETALL``
of a hash with a field per live worker; per tenant, the lanes' fair-share counters
(``read_tenant_load``: one pipeline, then the head of each waiting tenant's line). No key is ever
scanned, so the page costs the same with ten queued jobs or a million.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from ...contract import ACTIVITY_BUCKET_S, Keys, Lane, TenantSpec, month_of, read_tenant_load
from .listings import as_text

SLICES = 30  # activity slices charted: 5 minutes of 10 s
ROUTES = ("local", "remote", "cache")


def live_reports(raw: dict[Any, Any], now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The workers' reports split into (current, stale); unreadable ones are left out."""
    live, stale = [], []
    for value in raw.values():
        try:
            report = json.loads(value)
            (live if float(report["until"]) >= now else stale).append(report)
        except (ValueError, KeyError, TypeError):
            continue
    return live, stale


def activity_series(slices: list[dict[Any, Any]], first: int) -> list[dict[str, Any]]:
    """One point per slice: its start (epoch s), jobs per route, items per lane."""
    series = []
    for i, fields in enumerate(slices):
        counts = {as_text(k): int(v) for k, v in fields.items()}
        point: dict[str, Any] = {"at": (first + i) * ACTIVITY_BUCKET_S}
        point.update({r: counts.get(f"route:{r}", 0) for r in ROUTES})
        point.update({f"items_{lane.value}": counts.get(f"lane:{lane.value}", 0) for lane in Lane})
        series.append(point)
    return series


def lane_rows(
    depths: list[Any],
    oldest: list[Any],
    reports: list[dict[str, Any]],
    series: list[dict[str, Any]],
    now: float,
) -> list[dict[str, Any]]:
    rows = []
    done = [p for p in series if p["at"] + ACTIVITY_BUCKET_S <= now][-3:]  # the last 30 s, complete slices
    for lane, depth, first in zip(Lane, depths, oldest, strict=True):
        run_at = float(first[0][1]) / 1000 if first else None
        per_lane = [r.get("lanes", {}).get(lane.value, {}) for r in reports]
        items = sum(p[f"items_{lane.value}"] for p in done)
        rows.append(
            {
                "lane": lane.value,
                "depth": int(depth),
                "oldest_age_s": round(max(now - run_at, 0.0), 1) if run_at is not None else None,
                "packages_running": sum(int(x.get("packages", 0)) for x in per_lane),
                "items_in_flight": sum(int(x.get("items_in_flight", 0)) for x in per_lane),
                "items_per_s": round(items / (len(done) * ACTIVITY_BUCKET_S), 1) if done else 0.0,
            }
        )
    return rows


def gate_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model: open if any worker's gate is, with the signals holding it open."""
    models: dict[str, dict[str, Any]] = {}
    for report in reports:
        for model, signals in report.get("gates", {}).items():
            row = models.setdefault(model, {"model": model, "open": False, "signals": [], "workers_open": 0})
            if signals:
                row["open"] = True
                row["workers_open"] += 1
                row["signals"] = sorted(set(row["signals"]) | set(signals))
    return sorted(models.values(), key=lambda r: r["model"])


def _gauge(reports: Iterable[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [row for r in reports for row in r.get("gauges", {}).get(name, [])]


def replica_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Triton replicas (gRPC endpoints) as the workers see them: ready, and their breaker."""
    replicas: dict[str, dict[str, Any]] = {}
    for row in _gauge(reports, "replica_ready"):
        r = replicas.setdefault(
            row["replica"], {"replica": row["replica"], "ready": False, "breaker_open": False}
        )
        r["ready"] = r["ready"] or row["value"] >= 1
    for row in _gauge(reports, "circuit_open"):
        name = row["backend"].removeprefix("triton:")
        if name in replicas and row["value"] >= 1:
            replicas[name]["breaker_open"] = True
    return sorted(replicas.values(), key=lambda r: r["replica"])


def triton_model_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per Triton (its metrics endpoint) and model: pending requests and queue time per execution."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for gauge, field in (("replica_pending", "pending"), ("replica_queue_ms", "queue_ms")):
        for row in _gauge(reports, gauge):
            entry = rows.setdefault(
                (row["replica"], row["model"]),
                {"metrics": row["replica"], "model": row["model"], "pending": 0.0, "queue_ms": 0.0},
            )
            entry[field] = max(entry[field], float(row["value"]))  # workers read the same Triton
    return [rows[k] for k in sorted(rows)]


def provider_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Remotes: breaker (``remote`` or ``remote:<name>``) and the share of their rate limit in use."""
    providers: dict[str, dict[str, Any]] = {}
    for row in _gauge(reports, "provider_rate_factor"):
        p = providers.setdefault(row["provider"], {"provider": row["provider"], "breaker_open": False})
        p["rate_factor"] = min(p.get("rate_factor", 1.0), float(row["value"]))
    for row in _gauge(reports, "circuit_open"):
        backend = row["backend"]
        if backend == "remote" or backend.startswith("remote:"):
            name = backend.partition(":")[2] or "remote"
            p = providers.setdefault(name, {"provider": name, "breaker_open": False})
            p["breaker_open"] = p["breaker_open"] or row["value"] >= 1
    return sorted(providers.values(), key=lambda p: p["provider"])


def worker_rows(live: list[dict[str, Any]], stale: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    rows = []
    for alive, reports in ((True, live), (False, stale)):
        for r in reports:
            claims = [x.get("last_claim_at") for x in r.get("lanes", {}).values() if x.get("last_claim_at")]
            rows.append(
                {
                    "worker": r.get("worker"),
                    "alive": alive,
                    "seen_s_ago": round(max(now - float(r.get("at", 0)), 0.0), 1),
                    "up_s": round(max(now - float(r.get("started_at", now)), 0.0)),
                    "draining": bool(r.get("draining")),
                    "packages": {lane: x.get("packages", 0) for lane, x in r.get("lanes", {}).items()},
                    "last_claim_s_ago": round(now - max(claims), 1) if claims else None,
                }
            )
    return rows


async def read_overview(
    redis: Any, keys: Keys, viewer: TenantSpec, tenants: list[TenantSpec]
) -> dict[str, Any]:
    """The overview: everything for an admin key, the lanes and route split for a tenant's."""
    now = time.time()
    last = int(now // ACTIVITY_BUCKET_S)
    first = last - SLICES + 1
    month = month_of(now)
    budgeted = [t for t in tenants if t.monthly_remote_budget is not None] if viewer.admin else []
    async with redis.pipeline(transaction=False) as pipe:
        for lane in Lane:
            pipe.zcard(keys.queue(lane))
        for lane in Lane:
            pipe.zrange(keys.queue(lane), 0, 0, withscores=True)
        pipe.hgetall(keys.worker_status())
        for bucket in range(first, last + 1):
            pipe.hgetall(keys.activity(bucket))
        if budgeted:
            pipe.hmget(keys.remote_spend(month), [t.name for t in budgeted])
        out = await pipe.execute()
    n = len(Lane)
    depths, oldest, reports_raw = out[:n], out[n : 2 * n], out[2 * n]
    slices = out[2 * n + 1 : 2 * n + 1 + SLICES]
    spent = out[-1] if budgeted else []
    live, stale = live_reports(reports_raw, now)
    series = activity_series(slices, first)
    load = await read_tenant_load(redis, keys)
    doc: dict[str, Any] = {
        "object": "console.overview",
        "at": round(now, 3),
        "admin": viewer.admin,
        "lanes": lane_rows(depths, oldest, live, series, now),
        "activity": {"slice_s": ACTIVITY_BUCKET_S, "series": series},
        # The lanes' fair share (docs/scheduling.md): every tenant for an admin, else its own.
        "tenants": [asdict(r) for r in load if viewer.admin or r.tenant == viewer.name],
    }
    if viewer.admin:
        doc["gates"] = gate_rows(live)
        doc["replicas"] = replica_rows(live)
        doc["triton_models"] = triton_model_rows(live)
        doc["providers"] = provider_rows(live)
        doc["workers"] = worker_rows(live, stale, now)
        doc["budgets"] = budget_rows(budgeted, spent, month)
    return doc


def budget_rows(tenants: list[TenantSpec], spent: list[Any], month: str) -> list[dict[str, Any]]:
    rows = []
    for tenant, value in zip(tenants, spent, strict=True):
        used = float(value) if value is not None else 0.0
        budget = float(tenant.monthly_remote_budget or 0.0)
        rows.append(
            {
                "tenant": tenant.name,
                "month": month,
                "budget": budget,
                "spent": used,
                "left": max(budget - used, 0.0),
            }
        )
    return rows
