"""SSRF guard for webhook deliveries.

A webhook URL is chosen by a tenant, so without a guard any tenant could make a worker POST
to its own network: Redis, Triton, a cloud metadata service at 169.254.169.254. The guard:

- admits only ``http`` and ``https`` URLs without credentials;
- resolves the host once and checks every address it resolves to: loopback, private,
  link-local, site-local, multicast, reserved, unspecified and other non-global addresses are
  refused; an IPv6 address that embeds an IPv4 one (IPv4-mapped, -translated or -compatible,
  NAT64, 6to4, Teredo) is judged by the IPv4 address it reaches;
- hands back the checked address, and the caller connects to that address (the ``Host``
  header and TLS SNI keep the name), so a second DNS answer cannot switch the target
  between check and connect (DNS rebinding);
- an allowlist of ``host:port`` entries (names, addresses or CIDR blocks) admits internal
  receivers on those ports only; an entry without a port means ports 80 and 443.

Redirects are not followed by the deliverer; a redirect's target is still checked so the
error says when it pointed somewhere forbidden.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# An allowlist entry without a port admits only the web's own ports, never Redis or Triton's.
DEFAULT_PORTS = frozenset({80, 443})

_HOSTNAME = re.compile(r"^[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?$")


class UrlRefused(ValueError):
    """The URL may not be called: bad scheme, unresolvable, or a forbidden address."""


# ---------------------------------------------------------------------------- addresses


def _low32(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]


def _teredo(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    server, client = ip.teredo or (None, None)
    return [a for a in (server, client) if a is not None]


def _sixtofour(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    return [ip.sixtofour] if ip.sixtofour is not None else []


# IPv6 forms that carry an IPv4 address, and where it sits. Packets to them end up at that
# IPv4 address (through the kernel, a NAT64 gateway or a relay), so it decides.
Extract = Callable[[ipaddress.IPv6Address], list[ipaddress.IPv4Address]]
EMBEDDINGS: list[tuple[ipaddress.IPv6Network, str, Extract]] = [
    (ipaddress.IPv6Network("::ffff:0:0/96"), "IPv4-mapped", _low32),
    (ipaddress.IPv6Network("::ffff:0:0:0/96"), "IPv4-translated", _low32),
    (ipaddress.IPv6Network("::/96"), "IPv4-compatible", _low32),
    (ipaddress.IPv6Network("64:ff9b::/96"), "NAT64", _low32),
    (ipaddress.IPv6Network("64:ff9b:1::/96"), "NAT64 (local-use)", _low32),
    (ipaddress.IPv6Network("2002::/16"), "6to4", _sixtofour),
    (ipaddress.IPv6Network("2001::/32"), "Teredo", _teredo),
]

# RFC 8215's local-use NAT64 prefix may embed the IPv4 address at bits that depend on the
# local network's prefix length; only its /96 layout (above) can be checked, the rest is refused.
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, list[ipaddress.IPv4Address]] | None:
    """The form's name and the IPv4 addresses ``ip`` carries, or ``None`` if it carries none."""
    if ip.is_unspecified or ip.is_loopback:  # :: and ::1 sit inside ::/96 but are IPv6's own
        return None
    for network, form, extract in EMBEDDINGS:
        if ip in network:
            return form, extract(ip)
    return None


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be a webhook target, or ``None`` if it is a public address."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = embedded_ipv4(ip)
        if embedded is not None:
            return _embedded_reason(ip, *embedded)
    checks = [
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("site-local", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
        ("local-use NAT64", ip in NAT64_LOCAL_USE),
        ("private", ip.is_private),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("not globally routable", not ip.is_global),
    ]
    for name, hit in checks:
        if hit:
            return f"{ip} is {'an' if name[0] in 'aeiou' else 'a'} {name} address"
    return None


def _embedded_reason(
    ip: ipaddress.IPv6Address, form: str, addresses: list[ipaddress.IPv4Address]
) -> str | None:
    if not addresses:
        return f"{ip} is a {form} address without a usable IPv4 address"
    for v4 in addresses:
        reason = forbidden_reason(v4)
        if reason:
            return f"{ip} embeds {v4} ({form}), and {reason}"
    return None


# ---------------------------------------------------------------------------- allowlist


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One allowlist entry: a host name or a network, and the ports it admits."""

    ports: frozenset[int]
    host: str | None = None
    network: IPNetwork | None = None

    def matches(self, host: str, ip: IPAddress) -> bool:
        if self.host is not None:
            return self.host == _norm_host(host)
        assert self.network is not None
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return ip in self.network or (mapped is not None and mapped in self.network)


def _norm_host(host: str) -> str:
    return host.lower().rstrip(".")


def _split_port(entry: str) -> tuple[str, str | None]:
    """``entry`` as (target, port text): ``[v6]:port``, ``host:port``; a bare IPv6 has no port."""
    if entry.startswith("["):
        inside, closed, rest = entry[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise ValueError(f"allowlist entry {entry!r}: expected [IPv6 address or CIDR]:port")
        return inside, rest[1:] if rest else None
    if entry.count(":") > 1:  # an IPv6 address or CIDR: a port needs brackets around it
        return entry, None
    target, colon, port = entry.partition(":")
    return target, port if colon else None


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"allowlist entry {entry!r}: {text!r} is not a port")
    return int(text)


def parse_allow_entry(entry: str) -> AllowEntry:
    """``host:port``, ``address:port``, ``CIDR:port`` or ``[IPv6 address or CIDR]:port``.

    Without a port an entry admits ports 80 and 443 only. Raises ``ValueError`` when invalid.
    """
    text = entry.strip()
    target, port_text = _split_port(text)
    ports = DEFAULT_PORTS if port_text is None else frozenset({_port(port_text, text)})
    try:
        return AllowEntry(ports, network=ipaddress.ip_network(target, strict=False))
    except ValueError:
        pass
    host = _norm_host(target)
    if text.startswith("[") or not _HOSTNAME.match(host):
        raise ValueError(f"allowlist entry {entry!r}: not a host name, address or CIDR block")
    return AllowEntry(ports, host=host)


class Allowlist:
    """``host:port`` entries that webhooks may reach although internal."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.entries = [parse_allow_entry(e) for e in entries if e.strip()]

    def ports_for(self, host: str, ip: IPAddress) -> frozenset[int]:
        """The ports the allowlist admits for ``host`` (as named in the URL) at ``ip``."""
        ports: frozenset[int] = frozenset()
        for entry in self.entries:
            if entry.matches(host, ip):
                ports |= entry.ports
        return ports

    def admits(self, host: str, ip: IPAddress, port: int) -> bool:
        return port in self.ports_for(host, ip)


# ---------------------------------------------------------------------------- URLs


@dataclass(frozen=True, slots=True)
class Target:
    """A checked URL and the address to connect to."""

    url: httpx.URL
    ip: str

    def connect_to(self) -> tuple[str, str, int, str | None]:
        """Scheme, the checked address, port, and the TLS server name (the URL's host; https only)."""
        port = self.url.port or (443 if self.url.scheme == "https" else 80)
        return self.url.scheme, self.ip, port, self.url.host if self.url.scheme == "https" else None

    def headers(self) -> dict[str, str]:
        return {"Host": self.url.netloc.decode("ascii")}


def parse_url(raw: str) -> httpx.URL:
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, ValueError) as exc:
        raise UrlRefused(f"not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https"):
        raise UrlRefused(f"scheme {url.scheme!r} is not allowed; use http or https")
    if not url.host:
        raise UrlRefused("the URL has no host")
    if url.userinfo:
        raise UrlRefused("credentials in the URL are not allowed")
    return url


async def resolve(host: str, port: int) -> list[IPAddress]:
    """All addresses ``host`` resolves to (a literal address resolves to itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UrlRefused(f"cannot resolve {host}: {exc}") from None
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


def refusal(host: str, ip: IPAddress, port: int, allow: Allowlist) -> str | None:
    """Why ``ip`` (``host`` resolved) may not be called on ``port``, or ``None`` if it may."""
    reason = forbidden_reason(ip)
    if reason is None:
        return None
    ports = allow.ports_for(host, ip)
    if port in ports:
        return None
    if ports:
        listed = ", ".join(str(p) for p in sorted(ports))
        word = "port" if len(ports) == 1 else "ports"
        return (
            f"{host} refused: {reason}; the webhook allowlist admits it on {word} {listed} only, not {port}"
        )
    return f"{host} refused: {reason} (not in the webhook allowlist)"


async def check_url(raw: str, allow: Allowlist) -> Target:
    """Check ``raw`` and pick the address to connect to; raise :class:`UrlRefused`."""
    url = parse_url(raw)
    port = url.port or (443 if url.scheme == "https" else 80)
    addresses = await resolve(url.host, port)
    if not addresses:
        raise UrlRefused(f"{url.host} resolves to no address")
    for ip in addresses:
        reason = refusal(url.host, ip, port, allow)
        if reason:
            raise UrlRefused(reason)
    return Target(url=url, ip=str(addresses[0]))
