"""How every producer command reports: exit codes, one JSON error line, ``--debug``, and the
options and helpers the commands share."""

from __future__ import annotations

import functools
import json
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

from ..client import Client
from ..contract import (
    InvalidBody,
    JobResult,
    Status,
)
from ..errors import ApiError, JobNotFound, JobTimeout, OverspillError


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


def set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:  # never unset: `overspill --debug submit` sets it on the group
        ctx.meta[DEBUG_KEY] = True


debug_option = click.option(
    "--debug",
    is_flag=True,
    envvar="OVERSPILL_DEBUG",
    expose_value=False,
    callback=set_debug,
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


def open_client(redis_url: str, prefix: str) -> Client:
    try:
        return Client(redis_url, prefix=prefix)
    except ValueError as exc:  # redis-py refuses the URL itself
        raise CliError(Exit.BAD_INPUT, "invalid_request", f"--redis-url: {exc}") from exc


def read_body(body: str) -> Any:
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


def echo_envelope(result: JobResult) -> None:
    click.echo(result.model_dump_json(indent=2, exclude_none=True))


def check_outcome(result: JobResult) -> None:
    """A job that ended without a result fails the command (its envelope is on stdout already)."""
    if result.status in (Status.failed, Status.cancelled, Status.expired):
        why = f": {result.error.type}: {result.error.message}" if result.error else ""
        raise CliError(
            Exit.JOB_FAILED, f"job_{result.status.value}", f"job {result.id} {result.status.value}{why}"
        )


def timed_out(result: JobResult, seconds: float) -> CliError:
    """The wait ran out; the job carries on, so say how to follow it."""
    message = (
        f"job {result.id} still {result.status.value} after {seconds:g}s; "
        f"follow it with: overspill status {result.id} --wait SECONDS"
    )
    return CliError(Exit.TIMEOUT, "timeout", message)


def check_cancelled(result: JobResult) -> None:
    """Cancelled (now or before, as the API answers 200 for both), or the cancel did nothing."""
    if result.status == Status.cancelled:
        return
    if result.status in (Status.queued, Status.running):
        message = f"job {result.id} is running and cannot be cancelled; it will finish"
        raise CliError(Exit.NOT_CANCELLED, "job_running", message)
    raise CliError(Exit.NOT_CANCELLED, "job_finished", f"job {result.id} already {result.status.value}")
