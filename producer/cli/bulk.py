"""``overspill bulk``: a JSONL file of OpenAI requests through a batch, or a table of texts
(Parquet, CSV, JSONL of texts) to a Parquet of vectors; with progress, resumable."""

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
    "input_path",
    metavar="INPUT.jsonl|INPUT.parquet|INPUT.csv",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="OUTPUT.jsonl, or OUTPUT.parquet for a table",
)
@click.option("--model", default=None, help="A table's model (required for a table).")
@click.option(
    "--kind",
    type=click.Choice(["embed", "rerank", "chat"]),
    default="embed",
    show_default=True,
    help="What a table's rows are: texts to embed, queries with documents to rerank, prompts to chat on.",
)
@click.option(
    "--text-column", default="text", show_default=True, help="A table's text (or chat prompt) column."
)
@click.option("--query-column", default="query", show_default=True, help="A rerank table's query column.")
@click.option(
    "--documents-column",
    default="documents",
    show_default=True,
    help="A rerank table's documents column: a list of texts (in CSV, its JSON text).",
)
@click.option("--id-column", default=None, help="A table's id column (default: the row number).")
@click.option("--top-n", type=click.IntRange(1), default=None, help="Rerank: keep the best N documents.")
@click.option("--system", default=None, help="Chat: a system message before each prompt.")
@click.option("--max-tokens", type=click.IntRange(1), default=None, help="Chat: tokens to generate at most.")
@click.option("--temperature", type=click.FloatRange(0, 2), default=None, help="Chat: sampling temperature.")
@click.option(
    "--window-rows",
    default=4096,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="A table's rows per part (and per resume step).",
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
    model: str | None,
    kind: str,
    text_column: str,
    query_column: str,
    documents_column: str,
    id_column: str | None,
    window_rows: int,
    top_n: int | None,
    system: str | None,
    max_tokens: int | None,
    temperature: float | None,
) -> None:
    """Run a JSONL file of OpenAI batch requests; re-running the same command resumes it.

    Progress (done, failed, items/s, ETA, route split) goes to stderr, a JSON summary to
    stdout; straight to Redis, its files_dir is the absolute file store used. The batch id is
    kept in OUTPUT.jsonl.state. With --wait, a batch that ends other than completed exits 3.

    A table (Parquet, CSV, or JSONL whose lines are texts or objects with the columns) runs
    straight through Redis into OUTPUT.parquet: id, then per --kind embedding
    (fixed_size_list<float32, d>) and prompt_tokens; results (ranked index, relevance_score)
    and total_tokens; text, finish_reason, prompt_tokens and completion_tokens; then route,
    error. Parts are kept in OUTPUT.parquet.parts until the end, so the same command resumes
    after a kill.
    """
    from ..batches.table_kinds import TableKind
    from ..batches.tables import is_table

    if is_table(input_path) or output.suffix.lower() == ".parquet":
        if api_url:
            raise CliError(
                Exit.BAD_INPUT, "invalid_request", "a table runs straight to Redis: drop --api-url"
            )
        if not model:
            raise CliError(Exit.BAD_INPUT, "invalid_request", f"--model: a table's {kind} model")
        options = {
            "embed": {},
            "rerank": {"top_n": top_n},
            "chat": {"system": system, "max_tokens": max_tokens, "temperature": temperature},
        }[kind]
        table = TableKind(kind, model, text_column, query_column, documents_column, options)
        summary = asyncio.run(
            _table(input_path, output, table, (id_column, window_rows), redis_url, prefix, tenant)
        )
        click.echo(json.dumps(summary))
        if summary["failed"]:
            raise CliError(
                Exit.JOB_FAILED, "rows_failed", f"{summary['failed']} rows failed: see their error column"
            )
        return
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


async def _table(
    input_path: Path,
    output: Path,
    table: Any,  # a TableKind (imported when a table runs)
    rows: tuple[str | None, int],
    redis_url: str,
    prefix: str,
    tenant: str,
) -> dict[str, Any]:
    from ..batches.bulk import configure_cli_logging
    from ..batches.tables import TableError, TableRun
    from ..client import Client

    configure_cli_logging()
    async with Client(redis_url, prefix=prefix, coalesce_window_ms=None) as client:
        id_column, window_rows = rows
        run = TableRun(
            client, input_path, output, table.model, id_column=id_column, tenant=tenant,
            window_rows=window_rows, kind=table,
        )  # fmt: skip
        try:
            return await run.run()
        except TableError as exc:
            raise CliError(Exit.BAD_INPUT, "invalid_request", str(exc)) from None


def _batch_outcome(summary: dict[str, Any]) -> str:
    problems = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in summary.get("errors", [])[:3])
    return f"batch {summary['batch_id']} ended {summary['status']}" + (f": {problems}" if problems else "")
