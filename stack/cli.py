"""The ``overspill`` command: run the stack or one of its parts, and the producer commands."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import click

from producer.cli import COMMANDS, debug_option
from producer.contract import configure_logging

from .processes import StartError
from .stack import Stack, StackSettings
from .supervisor import stop_on_signals


@click.group()
@debug_option
def cli() -> None:
    """overspill: queue-driven batch inference on Triton with remote overflow."""


for command in COMMANDS:
    cli.add_command(command)


def _stack_settings(workers: int | None) -> StackSettings:
    settings = StackSettings()
    if workers is not None:
        settings.workers = workers
    return settings


def _run_supervised(settings: StackSettings, banner: Callable[[Stack], list[str]]) -> None:
    """Start the stack, restart what crashes, stop every child on Ctrl-C, SIGTERM or SIGHUP.

    A crash loop (or a part that does not come up) stops everything and exits 1 with its reason.
    """
    configure_logging("INFO")  # the supervisor's lines (deaths, restarts) go to stderr as JSON
    stop_on_signals()
    try:
        with Stack(settings) as stack:
            for line in banner(stack):
                click.echo(line)
            stack.supervise()
    except StartError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        click.echo("stopped")


@cli.command()
@click.option("--workers", type=int, default=None, help="Worker processes (default 1).")
def up(workers: int | None) -> None:
    """Run the embedded stack in the foreground until Ctrl-C; restart any part that crashes."""
    _run_supervised(
        _stack_settings(workers),
        up_banner,
    )


def up_banner(stack: Stack) -> list[str]:
    """What ``overspill up`` prints. The export line only for a Redis it started itself (no
    password): a Redis of the user's own is in their OVERSPILL_REDIS_URL already."""
    lines = [f"overspill is up: {stack.describe()}"]
    if stack.settings.redis_url is None:
        lines.append(f"export OVERSPILL_REDIS_URL={stack.redis_url}")
    return lines


@cli.command()
@click.option("--jobs", default=300, show_default=True, help="Embedding jobs to submit.")
def demo(jobs: int) -> None:
    """Start the stack, run a workload, print a report, stop everything."""
    from .demo import embedding_workload, mixed_workload, print_mixed, print_report

    try:
        with Stack(_stack_settings(None)) as stack:
            click.echo(f"stack up: {stack.describe()}")
            where = (stack.redis_url, stack.settings.prefix, stack.triton_metrics_url)
            report = asyncio.run(embedding_workload(*where, jobs))
            mixed = asyncio.run(mixed_workload(*where))
    except StartError as exc:
        raise click.ClickException(str(exc)) from exc
    print_report(report)
    print_mixed(mixed)
    if report["succeeded"] != report["jobs"] or not mixed["all_ok"]:
        raise click.ClickException("some jobs did not succeed; see the worker log in the run directory")


@cli.command()
def worker() -> None:
    """Run one worker in the foreground (configured by OVERSPILL_* variables)."""
    from workers.app.main import main

    main()


@cli.command()
def triton() -> None:
    """Run the bundled tritonserver on model_repository/ in the foreground; restart it if it crashes."""
    settings = StackSettings()
    settings.redis_url = "redis://unused"
    settings.workers = 0
    settings.api_port = 0
    settings.fake_remote_port = 0
    _run_supervised(
        settings, lambda stack: [f"triton up: grpc {stack.triton_url}, metrics {stack.triton_metrics_url}"]
    )


@cli.command("fake-remote")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8900, show_default=True)
def fake_remote(host: str, port: int) -> None:
    """Run the fake OpenAI-compatible remote (deterministic answers, steerable faults)."""
    from .fake_remote import run

    run(host, port)


@cli.command()
@click.option("--host", default=None, help="Address to bind (default OVERSPILL_HOST, else 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default OVERSPILL_PORT, else 8080).")
def api(host: str | None, port: int | None) -> None:
    """Run the HTTP API in the foreground (configured by OVERSPILL_* variables)."""
    from producer.api import main as api_main

    api_main([*(["--host", host] if host else []), *(["--port", str(port)] if port else [])])


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    cli()
