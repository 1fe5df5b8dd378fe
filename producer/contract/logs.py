"""structlog JSON logging for every process. Per-job context is bound with contextvars."""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_logging", "get_logger"]


def configure_logging(level: str = "INFO", json: bool = True) -> None:
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    # arq logs one line per job at INFO; at thousands of jobs/s that is noise, keep its warnings.
    logging.getLogger("arq").setLevel(max(logging.WARNING, logging.getLevelName(level)))
    # httpx logs every request at INFO (the signal sampler alone makes two a second).
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLevelName(level)))
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
