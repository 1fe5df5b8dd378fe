"""Triton endpoints as configured: ``host:port[*weight][/primary|/backup]``, comma-separated.

Parsed when the settings are read, so a bad list fails at start naming the entry;
:mod:`workers.backends.local.replicas` balances over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    primary = "primary"
    backup = "backup"


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str  # gRPC host:port
    weight: float = 1.0
    role: Role = Role.primary


def parse_endpoints(spec: str) -> list[Endpoint]:
    """``host:port[*weight][/role]`` entries, comma-separated; ValueError names a bad entry."""
    endpoints = [_parse_one(part.strip()) for part in spec.split(",") if part.strip()]
    if not endpoints:
        raise ValueError("no Triton endpoint given")
    urls = [e.url for e in endpoints]
    if len(set(urls)) != len(urls):
        raise ValueError(f"a Triton endpoint is listed twice: {spec!r}")
    return endpoints


def _parse_one(entry: str) -> Endpoint:
    rest, _, role = entry.partition("/")
    url, _, weight = rest.partition("*")
    host, _, port = url.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Triton endpoint {entry!r} is not host:port[*weight][/primary|/backup]")
    try:
        w = float(weight) if weight else 1.0
        r = Role(role) if role else Role.primary
    except ValueError as exc:
        raise ValueError(f"Triton endpoint {entry!r}: {exc}") from exc
    if not w > 0:
        raise ValueError(f"Triton endpoint {entry!r}: weight must be > 0")
    return Endpoint(url, w, r)
