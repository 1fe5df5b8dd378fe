"""``overspill usage``: the usage ledger per tenant, model, route and day, and the what-if report."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from typing import Any

import click

from ..contract import (
    UsageRow,
    days_between,
    month_so_far,
    parse_day,
    read_usage,
    what_if,
)
from .reporting import (
    CliError,
    Exit,
    command,
    open_client,
    prefix_option,
    redis_option,
)


def _usage_table(rows: list[UsageRow]) -> str:
    head = ("day", "tenant", "model", "route", "requests", "items", "prompt", "completion", "gpu_s", "cost $")
    lines = [head] + [
        (r.day, r.tenant, r.model, r.route, str(r.requests), str(r.items), str(r.prompt_tokens),
         str(r.completion_tokens), f"{r.gpu_s:.3f}", f"{r.cost:.6f}")
        for r in rows
    ]  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines)


def _what_if_text(report: dict[str, Any]) -> str:
    cannot = ", ".join(report["cannot_be_local"]) or "none"
    return "\n".join(
        [
            f"this period cost       ${report['cost']:.6f} (remote ${report['remote_cost']:.6f}, "
            f"local ${report['local_cost']:.6f})",
            f"all-remote would cost  ${report['all_remote_cost']:.6f} (models the remotes price)",
            f"all-local would need   {report['all_local_gpu_s']:.3f} GPU-seconds "
            f"(used {report['local_gpu_s']:.3f}); cannot run locally: {cannot}",
            f"cost-aware routing saved ${report.get('saved', 0.0):.6f} (remote cost of jobs kept local)",
        ]
    )


def _day(value: str | None, default: dt.date, name: str) -> dt.date:
    if value is None:
        return default
    try:
        return parse_day(value)
    except ValueError:
        raise CliError(Exit.BAD_INPUT, "invalid_request", f"{name}: a UTC day, YYYY-MM-DD") from None


@command()
@click.option("--start", help="First UTC day (YYYY-MM-DD); default: the 1st of this month.")
@click.option("--end", help="Last UTC day (YYYY-MM-DD); default: today.")
@click.option("--tenant", help="One tenant's rows only.")
@click.option("--json", "as_json", is_flag=True, help="Rows, totals (and --what-if) as one JSON document.")
@click.option("--what-if", "what_if_report", is_flag=True, help="Cost vs all-remote vs all-local; saved.")
@redis_option
@prefix_option
def usage(
    start: str | None,
    end: str | None,
    tenant: str | None,
    as_json: bool,
    what_if_report: bool,
    redis_url: str,
    prefix: str,
) -> None:
    """The usage ledger per tenant, model, route and day: tokens, GPU-seconds and cost."""
    first_default, last_default = month_so_far(time.time())
    first, last = _day(start, first_default, "--start"), _day(end, last_default, "--end")
    try:
        days = days_between(first, last)
    except ValueError as exc:
        raise CliError(Exit.BAD_INPUT, "invalid_request", str(exc)) from None

    async def go() -> list[UsageRow]:
        async with open_client(redis_url, prefix) as client:
            return await read_usage(client.redis, client.keys, days, tenant)

    rows = asyncio.run(go())
    report = what_if(rows) if what_if_report else None
    if as_json:
        doc: dict[str, Any] = {
            "start": first.isoformat(),
            "end": last.isoformat(),
            "data": [r.model_dump() for r in rows],
        }
        if report is not None:
            doc["what_if"] = report
        click.echo(json.dumps(doc))
        return
    click.echo(_usage_table(rows))
    if report is not None:
        click.echo("")
        click.echo(_what_if_text(report))
