"""``overspill bulk``: a JSONL file through a batch, with progress, resumable."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click

from .reporting import (
    CliError,
    Exit,
    command,
    prefix_option,
    redis_option,
)


@command()
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
    help="Without --api-url: the batch file store, the API's if one runs. "
    "Default: $OVERSPILL_RUN_DIR/files, else .run/files under the current directory.",
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
    stdout; straight to Redis, its files_dir is the absolute file store used. The batch id is
    kept in OUTPUT.jsonl.state. With --wait, a batch that ends other than completed exits 3.
    """
    from ..batches import BatchSettings
    from ..batches.bulk import bulk_main, configure_cli_logging

    if not output.parent.is_dir():  # found now, not after the batch was submitted
        raise CliError(Exit.BAD_INPUT, "invalid_request", f"--output: {output.parent} is not a directory")
    configure_cli_logging()
    overrides: dict[str, Any] = {"redis_url": redis_url, "prefix": prefix}
    if files_dir is not None:
        overrides["files_dir"] = files_dir
    settings = BatchSettings(**overrides)
    if not api_url and files_dir is None and "run_dir" not in settings.model_fields_set:
        click.echo(
            f"overspill bulk: file store {settings.directory()} (under the current directory)", err=True
        )
    summary = asyncio.run(bulk_main(input_path, output, endpoint, wait, api_url, api_key, settings, tenant))
    click.echo(json.dumps(summary))
    if wait and summary["status"] != "completed":
        raise CliError(Exit.JOB_FAILED, f"batch_{summary['status']}", _batch_outcome(summary))


def _batch_outcome(summary: dict[str, Any]) -> str:
    problems = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in summary.get("errors", [])[:3])
    return f"batch {summary['batch_id']} ended {summary['status']}" + (f": {problems}" if problems else "")
