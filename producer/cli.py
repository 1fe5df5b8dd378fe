"""Producer commands: submit a job, read its status, wait for it, cancel it, run a bulk file.

Results go to stdout. Errors go to stderr as one JSON line ``{"error": {"type", "message"}}``
(a traceback only with ``--debug`` or ``OVERSPILL_DEBUG=1``), and the exit code says what
happened: :class:`Exit`, listed in every command's help.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import time
import traceback
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .client import Client
from .contract import (
    InvalidBody,
    JobResult,
    Status,
    UsageRow,
    days_between,
    hash_api_key,
    month_so_far,
    new_api_key,
    read_usage,
    what_if,
)
from .errors import ApiError, JobNotFound, JobTimeout, OverspillError


class Exit(IntEnum):
    """The exit codes of the producer commands."""

    OK = 0
    BAD_INPUT = 1
    USAGE = 2  # click's own
    JOB_FAILED = 3
    NOT_CANCELLED = 4
    UNREACHABLE = 5
    TIMEOUT = 6
    INTERNAL = 7
    INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


MEANINGS: dict[Exit, str] = {
    Exit.OK: "ok",
    Exit.BAD_INPUT: "bad input: BODY, a file, an option, an unknown job id, another file store",
    Exit.USAGE: "usage error: unknown option, missing argument, value not among the choices",
    Exit.JOB_FAILED: "job (or batch) failed, was cancelled or expired",
    Exit.NOT_CANCELLED: "cancel did nothing: the job was running or had finished",
    Exit.UNREACHABLE: "Redis or API unreachable, or failing on its side",
    Exit.TIMEOUT: "timed out waiting for the job",
    Exit.INTERNAL: "internal error (--debug shows the traceback)",
    Exit.INTERRUPTED: "interrupted (Ctrl-C)",
}

# "\b" keeps click from re-wrapping the table.
EXIT_CODES_HELP = "\b\nExit codes:\n" + "\n".join(
    f"  {code.value:<4}{text}" for code, text in MEANINGS.items()
)

# Error types that mean the other side (Redis, the API), not the input.
SERVER_TYPES = frozenset({"unreachable", "server_error"})

DEBUG_KEY = "overspill.debug"  # in click's ctx.meta, shared by the group and its commands


class CliError(Exception):
    """A failure the command reports as one error line and an exit code."""

    def __init__(self, code: Exit, error_type: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.type = error_type
        self.message = message


# ---------------------------------------------------------------------------- reporting


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:  # never unset: `overspill --debug submit` sets it on the group
        ctx.meta[DEBUG_KEY] = True


debug_option = click.option(
    "--debug",
    is_flag=True,
    envvar="OVERSPILL_DEBUG",
    expose_value=False,
    callback=_set_debug,
    help="On an error, print its traceback too (or set OVERSPILL_DEBUG=1).",
)


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(DEBUG_KEY))


def _as_cli_error(exc: BaseException) -> CliError:
    """Every failure as a type, a message and its exit code."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return CliError(Exit.INTERRUPTED, "interrupted", "interrupted")
    if isinstance(exc, JobTimeout):
        return CliError(Exit.TIMEOUT, "timeout", str(exc))
    if isinstance(exc, JobNotFound):
        return CliError(Exit.BAD_INPUT, "not_found", str(exc))
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return CliError(Exit.UNREACHABLE, "unreachable", f"cannot reach Redis: {exc}")
    if isinstance(exc, RedisError):
        return CliError(Exit.UNREACHABLE, "server_error", f"Redis failed: {type(exc).__name__}: {exc}")
    if isinstance(exc, ApiError):  # the batch engine refused, as the API would
        return CliError(Exit.BAD_INPUT, "api_error", exc.message)
    if isinstance(exc, InvalidBody | OverspillError):  # bulk's errors carry their type
        kind = str(getattr(exc, "type", "invalid_request"))
        return CliError(Exit.UNREACHABLE if kind in SERVER_TYPES else Exit.BAD_INPUT, kind, str(exc))
    if isinstance(exc, ValidationError):  # settings or options from the environment
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        return CliError(Exit.BAD_INPUT, "invalid_request", problems)
    return CliError(Exit.INTERNAL, "internal_error", f"{type(exc).__name__}: {exc}")


def _fail(exc: BaseException) -> NoReturn:
    error = _as_cli_error(exc)
    if _debug() and not (isinstance(exc, CliError) and exc.__cause__ is None):
        traceback.print_exception(exc)
    click.echo(json.dumps({"error": {"type": error.type, "message": error.message}}), err=True)
    raise click.exceptions.Exit(error.code)


def _reported(fn: Callable[..., None]) -> Callable[..., None]:
    """Run a command; whatever it raises becomes one error line and its exit code."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise  # click's own exits and usage errors (2) stay click's
        except BaseException as exc:
            _fail(exc)

    return run


def command(name: str | None = None) -> Callable[[Callable[..., None]], click.Command]:
    """A producer command: ``--debug``, the exit codes in its help, every failure reported."""

    def make(fn: Callable[..., None]) -> click.Command:
        return click.command(name, epilog=EXIT_CODES_HELP)(debug_option(_reported(fn)))

    return make


# ---------------------------------------------------------------------------- helpers

redis_option = click.option(
    "--redis-url", envvar="OVERSPILL_REDIS_URL", default="redis://127.0.0.1:6380/0", show_default=True
)
prefix_option = click.option("--prefix", envvar="OVERSPILL_PREFIX", default="overspill", show_default=True)


def _client(redis_url: str, prefix: str) -> Client:
    try:
        return Client(redis_url, prefix=prefix)
    except ValueError as exc:  # redis-py refuses the URL itself
        raise CliError(Exit.BAD_INPUT, "invalid_request", f"--redis-url: {exc}") from exc


def _read_body(body: str) -> Any:
    """BODY as JSON, given inline or as @file."""
    raw = body
    if body.startswith("@"):
        path = Path(body[1:])
        try:
            raw = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise CliError(
                Exit.BAD_INPUT, "invalid_request", f"cannot read BODY from {path}: {reason}"
            ) from exc
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CliError(Exit.BAD_INPUT, "invalid_request", f"BODY is not valid JSON: {exc}") from exc


def _echo_envelope(result: JobResult) -> None:
    click.echo(result.model_dump_json(indent=2, exclude_none=True))


def _check_outcome(result: JobResult) -> None:
    """A job that ended without a result fails the command (its envelope is on stdout already)."""
    if result.status in (Status.failed, Status.cancelled, Status.expired):
        why = f": {result.error.type}: {result.error.message}" if result.error else ""
        raise CliError(
            Exit.JOB_FAILED, f"job_{result.status.value}", f"job {result.id} {result.status.value}{why}"
        )


def _timed_out(result: JobResult, seconds: float) -> CliError:
    """The wait ran out; the job carries on, so say how to follow it."""
    message = (
        f"job {result.id} still {result.status.value} after {seconds:g}s; "
        f"follow it with: overspill status {result.id} --wait SECONDS"
    )
    return CliError(Exit.TIMEOUT, "timeout", message)


def _check_cancelled(result: JobResult) -> None:
    """Cancelled (now or before, as the API answers 200 for both), or the cancel did nothing."""
    if result.status == Status.cancelled:
        return
    if result.status in (Status.queued, Status.running):
        message = f"job {result.id} is running and cannot be cancelled; it will finish"
        raise CliError(Exit.NOT_CANCELLED, "job_running", message)
    raise CliError(Exit.NOT_CANCELLED, "job_finished", f"job {result.id} already {result.status.value}")


# ---------------------------------------------------------------------------- jobs


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
    request = _read_body(body)

    async def go() -> None:
        async with _client(redis_url, prefix) as client:
            job_id = await client.submit(kind, request, lane=lane, local_only=local_only)
            if not wait:
                click.echo(job_id)
                return
            try:
                result = await client.wait(job_id, timeout)
            except JobTimeout:
                raise _timed_out(await client.get(job_id), timeout) from None
            _echo_envelope(result)
            _check_outcome(result)

    asyncio.run(go())


@command()
@click.argument("job_id")
@click.option("--wait", "wait_s", default=0.0, help="Long-poll up to this many seconds (then exit 6).")
@redis_option
@prefix_option
def status(job_id: str, wait_s: float, redis_url: str, prefix: str) -> None:
    """Print a job's envelope; the exit code is its outcome (3 if it failed, was cancelled or expired)."""

    async def go() -> None:
        async with _client(redis_url, prefix) as client:
            try:
                result = await (client.wait(job_id, wait_s) if wait_s else client.get(job_id))
            except JobTimeout:
                result = await client.get(job_id)
            _echo_envelope(result)
            if wait_s and not result.done:
                raise _timed_out(result, wait_s)
            _check_outcome(result)

    asyncio.run(go())


@command()
@click.argument("job_id")
@redis_option
@prefix_option
def cancel(job_id: str, redis_url: str, prefix: str) -> None:
    """Cancel a queued job. A running or finished one is left alone (exit 4)."""

    async def go() -> None:
        async with _client(redis_url, prefix) as client:
            result = await client.cancel(job_id)
            click.echo(json.dumps({"id": job_id, "status": result.status.value}))
            _check_cancelled(result)

    asyncio.run(go())


@command("api-key")
def api_key() -> None:
    """Make a new API key; put its sha256 (never the key) in the tenants file."""
    key = new_api_key()
    click.echo(json.dumps({"api_key": key, "api_key_sha256": hash_api_key(key)}))


# ---------------------------------------------------------------------------- bulk


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
    from .batches import BatchSettings
    from .batches.bulk import bulk_main, configure_cli_logging

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
        return dt.date.fromisoformat(value)
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
        async with _client(redis_url, prefix) as client:
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


COMMANDS = [submit, status, cancel, api_key, bulk, usage]
