"""The usage ledger's layout, shared by the workers (who write it) and the API and CLI (who read).

One Redis hash per UTC day (``Keys.usage(day)``); each field is
``tenant \\t model \\t route \\t measure`` and holds a running total (HINCRBYFLOAT), so any number
of workers add to it without coordination and a reader sums the days it asks for.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

MEASURES = (
    "requests",
    "items",
    "prompt_tokens",
    "completion_tokens",
    "gpu_s",
    "cost",
    "remote_cost",
    "saved",
)
MONEY = ("gpu_s", "cost", "remote_cost", "saved")  # the measures kept as floats
USAGE_TTL_S = 400 * 24 * 3600  # a year of daily hashes, and a month to spare
SEP = "\t"


class UsageRow(BaseModel):
    """One tenant × model × route × day of the ledger."""

    day: str
    tenant: str
    model: str
    route: str  # local | remote | cache
    requests: int = 0
    items: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    gpu_s: float = 0.0  # local only: this job's share of each Triton execution's time
    cost: float = 0.0  # dollars, from the providers file's prices
    remote_cost: float = 0.0  # the same tokens on the remote a spilled job would go to first
    saved: float = 0.0  # remote cost avoided: jobs cost-aware routing kept local (their remote_cost)


def usage_field(tenant: str, model: str, route: str, measure: str) -> str:
    return SEP.join((tenant, model, route, measure))


def day_of(epoch_s: float) -> str:
    return _day(int(epoch_s // 86400))


def month_of(epoch_s: float) -> str:
    return _day(int(epoch_s // 86400))[:7]


@functools.lru_cache(maxsize=8)
def _day(index: int) -> str:
    """The UTC date of a day number; cached, as every result of the day asks for it."""
    return (dt.date(1970, 1, 1) + dt.timedelta(days=index)).isoformat()


DAY_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"  # RFC 3339 full-date, as the OpenAPI document says
_DAY = re.compile(DAY_PATTERN)


def parse_day(value: str) -> dt.date:
    """A UTC day written ``YYYY-MM-DD`` and nothing else: ``date.fromisoformat`` also takes
    ``20261207`` and ``2026-W49-1``, which the document does not promise. ValueError otherwise."""
    if not _DAY.fullmatch(value):
        raise ValueError(f"not YYYY-MM-DD: {value!r}")
    return dt.date.fromisoformat(value)


def last_days(first: dt.date, last: dt.date, max_days: int) -> dt.date:
    """``first``, moved forward so that ``first``..``last`` holds at most ``max_days`` days.
    Safe at the calendar's ends: ``last - max_days`` before year 1 is no date at all."""
    if (last - dt.date.min).days < max_days - 1:
        return first
    return max(first, last - dt.timedelta(days=max_days - 1))


def days_between(first: dt.date, last: dt.date, *, max_days: int = 400) -> list[str]:
    """Every day from ``first`` to ``last``, inclusive (at most ``max_days``)."""
    if last < first:
        raise ValueError("the period ends before it starts")
    span = (last - first).days + 1
    if span > max_days:
        raise ValueError(f"a period has at most {max_days} days")
    return [(first + dt.timedelta(days=d)).isoformat() for d in range(span)]


def month_so_far(now: float) -> tuple[dt.date, dt.date]:
    today = dt.datetime.fromtimestamp(now, dt.UTC).date()
    return today.replace(day=1), today


def rows_of(day: str, fields: dict[Any, Any], tenant: str | None = None) -> list[UsageRow]:
    """The rows of one day's hash (only ``tenant``'s if given)."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for raw_field, raw_value in fields.items():
        name = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
        parts = name.split(SEP)
        if len(parts) != 4 or parts[3] not in MEASURES or (tenant is not None and parts[0] != tenant):
            continue
        value = float(raw_value)
        row = rows.setdefault((parts[0], parts[1], parts[2]), {})
        row[parts[3]] = value if parts[3] in MONEY else round(value)
    return [
        UsageRow(day=day, tenant=t, model=m, route=r, **measures)
        for (t, m, r), measures in sorted(rows.items())
    ]


async def read_usage(redis: Any, keys: Any, days: Iterable[str], tenant: str | None = None) -> list[UsageRow]:
    """The ledger's rows for ``days`` (one round trip), ``tenant``'s alone if given."""
    days = list(days)
    pipe = redis.pipeline(transaction=False)
    for day in days:
        pipe.hgetall(keys.usage(day))
    found = await pipe.execute()
    return [row for day, fields in zip(days, found, strict=True) for row in rows_of(day, fields, tenant)]


def what_if(rows: Iterable[UsageRow]) -> dict[str, Any]:
    """This period's cost, what it would have cost all-remote, what all-local would have needed.

    All-remote prices every job's tokens at the remote's price (``remote_cost``); all-local
    charges each remote job's items at the GPU-seconds per item its model measured locally in
    the same period. A model with no local measure (remote-only) cannot be made local.
    ``saved`` is what cost-aware routing avoided paying: the remote price of the tokens of the
    jobs it kept local while the overflow rule would have spilled them.
    """
    rows = list(rows)
    cost = sum(r.cost for r in rows)
    local_gpu = sum(r.gpu_s for r in rows if r.route == "local")
    per_item: dict[str, tuple[float, int]] = {}
    for r in rows:
        if r.route == "local" and r.items:
            gpu, items = per_item.get(r.model, (0.0, 0))
            per_item[r.model] = (gpu + r.gpu_s, items + r.items)
    extra_gpu = 0.0
    not_local: set[str] = set()
    for r in rows:
        if r.route != "remote":
            continue
        if r.model in per_item and per_item[r.model][1]:
            gpu, items = per_item[r.model]
            extra_gpu += r.items * gpu / items
        else:
            not_local.add(r.model)
    remote_spend = sum(r.cost for r in rows if r.route == "remote")
    return {
        "cost": round(cost, 9),
        "remote_cost": round(remote_spend, 9),
        "local_cost": round(cost - remote_spend, 9),
        "all_remote_cost": round(sum(r.remote_cost for r in rows), 9),
        "local_gpu_s": round(local_gpu, 6),
        "all_local_gpu_s": round(local_gpu + extra_gpu, 6),
        "cannot_be_local": sorted(not_local),
        "saved": round(sum(r.saved for r in rows), 9),
    }
