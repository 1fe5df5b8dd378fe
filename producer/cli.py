"""Producer commands: submit a job, read its status, wait for it, cancel it."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import click

from .client import Client
from .errors import OverspillError
from .jobs import InvalidBody

redis_option = click.option(
    "--redis-url", envvar="OVERSPILL_REDIS_URL", default="redis://127.0.0.1:6380/0", show_default=True
)
prefix_option = click.option("--prefix", envvar="OVERSPILL_PREFIX", default="overspill", show_default=True)


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except (OverspillError, InvalidBody) as exc:
        click.echo(json.dumps({"error": {"type": type(exc).__name__, "message": str(exc)}}), err=True)
        sys.exit(1)


@click.command()
@click.argument("kind", type=click.Choice(["chat", "embed", "rerank"]))
@click.argument("body")
@click.option("--lane", type=click.Choice(["interactive", "bulk"]), default="interactive")
@click.option("--local-only", is_flag=True, help="Never send this job to the remote API.")
@click.option("--wait/--no-wait", default=True, help="Wait for the result and print it.")
@click.option("--timeout", default=120.0, show_default=True)
@redis_option
@prefix_option
def submit(
    kind: str, body: str, lane: str, local_only: bool, wait: bool, timeout: float, redis_url: str, prefix: str
) -> None:
    """Submit one job. BODY is the OpenAI-shaped request as JSON (or @file.json)."""
    raw = open(body[1:]).read() if body.startswith("@") else body

    async def go() -> None:
        async with Client(redis_url, prefix=prefix) as client:
            job_id = await client.submit(kind, json.loads(raw), lane=lane, local_only=local_only)
            if not wait:
                click.echo(job_id)
                return
            result = await client.wait(job_id, timeout)
            click.echo(result.model_dump_json(indent=2, exclude_none=True))

    _run(go())


@click.command()
@click.argument("job_id")
@click.option("--wait", "wait_s", default=0.0, help="Long-poll up to this many seconds.")
@redis_option
@prefix_option
def status(job_id: str, wait_s: float, redis_url: str, prefix: str) -> None:
    """Print a job's envelope."""

    async def go() -> None:
        async with Client(redis_url, prefix=prefix) as client:
            result = await (client.wait(job_id, wait_s) if wait_s else client.get(job_id))
            click.echo(result.model_dump_json(indent=2, exclude_none=True))

    _run(go())


@click.command()
@click.argument("job_id")
@redis_option
@prefix_option
def cancel(job_id: str, redis_url: str, prefix: str) -> None:
    """Cancel a queued job."""

    async def go() -> None:
        async with Client(redis_url, prefix=prefix) as client:
            result = await client.cancel(job_id)
            click.echo(json.dumps({"id": job_id, "status": result.status.value}))

    _run(go())


COMMANDS = [submit, status, cancel]
