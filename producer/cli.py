"""Producer commands: submit a job, read its status, wait for it, cancel it."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from .client import Client
from .contract import InvalidBody, hash_api_key, new_api_key
from .errors import OverspillError

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


@click.command("api-key")
def api_key() -> None:
    """Make a new API key; put its sha256 (never the key) in the tenants file."""
    key = new_api_key()
    click.echo(json.dumps({"api_key": key, "api_key_sha256": hash_api_key(key)}))


@click.command()
@click.argument(
    "input_path", metavar="INPUT.jsonl", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="OUTPUT.jsonl"
)
@click.option(
    "--endpoint",
    type=click.Choice(["/v1/embeddings", "/v1/chat/completions", "/v1/rerank"]),
    default=None,
    help="The batch's endpoint (default: the url of the first line).",
)
@click.option(
    "--wait/--no-wait", default=True, help="Follow the batch and write the output, or submit and exit."
)
@click.option(
    "--api-url", envvar="OVERSPILL_API_URL", default=None, help="Go through the HTTP API at this URL."
)
@click.option("--api-key", envvar="OVERSPILL_API_KEY", default=None, help="The API key (with --api-url).")
@redis_option
@prefix_option
@click.option(
    "--files-dir",
    envvar="OVERSPILL_FILES_DIR",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Without --api-url: the batch file store (the API's, if one runs).",
)
@click.option(
    "--tenant", default="default", show_default=True, help="Without --api-url: the tenant to run as."
)
def bulk(
    input_path: Path,
    output: Path,
    endpoint: str | None,
    wait: bool,
    api_url: str | None,
    api_key: str | None,
    redis_url: str,
    prefix: str,
    files_dir: Path | None,
    tenant: str,
) -> None:
    """Run a JSONL file of OpenAI batch requests; re-running the same command resumes it.

    Progress (done, failed, items/s, ETA, route split) goes to stderr, a JSON summary to
    stdout. The batch id is kept in OUTPUT.jsonl.state.
    """
    from .batches import BatchSettings
    from .batches.bulk import bulk_main, configure_cli_logging

    configure_cli_logging()

    overrides: dict[str, Any] = {"redis_url": redis_url, "prefix": prefix}
    if files_dir is not None:
        overrides["files_dir"] = files_dir
    settings = BatchSettings(**overrides)
    summary = _run(bulk_main(input_path, output, endpoint, wait, api_url, api_key, settings, tenant))
    click.echo(json.dumps(summary))
    if wait and summary["status"] != "completed":
        sys.exit(1)


COMMANDS = [submit, status, cancel, api_key, bulk]
