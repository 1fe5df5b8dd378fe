"""structlog JSON logging for every process. Per-job context is bound with contextvars."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog

__all__ = ["configure_logging", "get_logger", "redact_url"]

# The password of a URL's userinfo (redis://:secret@host, https://user:secret@host/...).
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@/\s]+)@")


def redact_url(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text) if "@" in text else text


def _redact(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """Last line of defence: no log line carries a URL's password, whoever logged it."""
    for key, value in event.items():
        if isinstance(value, str) and "@" in value:
            event[key] = redact_url(value)
    return event


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
            _redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
