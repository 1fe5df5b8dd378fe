"""One job at a time: ``overspill submit | status | cancel``, and ``api-key``."""

from __future__ import annotations

import asyncio
import json

import click

from ..contract import (
    hash_api_key,
    new_api_key,
)
from ..errors import JobTimeout
from .reporting import (
    check_cancelled,
    check_outcome,
    command,
    echo_envelope,
    open_client,
    prefix_option,
    read_body,
    redis_option,
    timed_out,
)


@command()
@click.argument("kind", type=click.Choice(["chat", "embed", "rerank"]))
@click.argument("body")
@click.option("--lane", type=click.Choice(["interactive", "bulk"]), default="interactive")
@click.option("--local-only", is_flag=True, help="Never send this job to the remote API.")
@click.option("--wait/--no-wait", default=True, help="Wait for the result and print it.")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait (then exit 6).")
@redis_option
@prefix_option
def submit(
    kind: str, body: str, lane: str, local_only: bool, wait: bool, timeout: float, redis_url: str, prefix: str
) -> None:
    """Submit one job. BODY is the OpenAI-shaped request as JSON (or @file.json).

    With --wait, the job's envelope goes to stdout once it is finished; with --no-wait, its id.
    """
    request = read_body(body)

    async def go() -> None:
        async with open_client(redis_url, prefix) as client:
            job_id = await client.submit(kind, request, lane=lane, local_only=local_only)
            if not wait:
                click.echo(job_id)
                return
            try:
                result = await client.wait(job_id, timeout)
            except JobTimeout:
                raise timed_out(await client.get(job_id), timeout) from None
            echo_envelope(result)
            check_outcome(result)

    asyncio.run(go())


@command()
@click.argument("job_id")
@click.option("--wait", "wait_s", default=0.0, help="Long-poll up to this many seconds (then exit 6).")
@redis_option
@prefix_option
def status(job_id: str, wait_s: float, redis_url: str, prefix: str) -> None:
    """Print a job's envelope; the exit code is its outcome (3 if it failed, was cancelled or expired)."""

    async def go() -> None:
        async with open_client(redis_url, prefix) as client:
            try:
                result = await (client.wait(job_id, wait_s) if wait_s else client.get(job_id))
            except JobTimeout:
                result = await client.get(job_id)
            echo_envelope(result)
            if wait_s and not result.done:
                raise timed_out(result, wait_s)
            check_outcome(result)

    asyncio.run(go())


@command()
@click.argument("job_id")
@redis_option
@prefix_option
def cancel(job_id: str, redis_url: str, prefix: str) -> None:
    """Cancel a queued job, stop a running chat job, or take a running job's inputs out of the
    worker's batcher (waits up to 5 s). Inputs already at the backend, or a finished job, are
    left alone (exit 4)."""

    async def go() -> None:
        async with open_client(redis_url, prefix) as client:
            result = await client.cancel(job_id, settle_s=5.0)
            click.echo(json.dumps({"id": job_id, "status": result.status.value}))
            check_cancelled(result)

    asyncio.run(go())


@command("api-key")
def api_key() -> None:
    """Make a new API key; put its sha256 (never the key) in the tenants file."""
    key = new_api_key()
    click.echo(json.dumps({"api_key": key, "api_key_sha256": hash_api_key(key)}))
