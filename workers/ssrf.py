"""SSRF guard for webhook deliveries.

A webhook URL is chosen by a tenant, so without a guard any tenant could make a worker POST
to its own network: Redis, Triton, a cloud metadata service at 169.254.169.254. The guard:

- admits only ``http`` and ``https`` URLs without credentials;
- resolves the host once and checks every address it resolves to: loopback, private,
  link-local, multicast, reserved, unspecified and other non-global addresses are refused;
- hands back the checked address, and the caller connects to that address (the ``Host``
  header and TLS SNI keep the name), so a second DNS answer cannot switch the target
  between check and connect (DNS rebinding);
- an allowlist (host names, addresses or CIDR blocks) admits internal receivers.

Redirects are not followed by the deliverer; a redirect's target is still checked so the
error says when it pointed somewhere forbidden.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class UrlRefused(ValueError):
    """The URL may not be called: bad scheme, unresolvable, or a forbidden address."""


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be a webhook target, or ``None`` if it is a public address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return forbidden_reason(ip.ipv4_mapped)
    checks = [
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("private", ip.is_private),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("not globally routable", not ip.is_global),
    ]
    for name, hit in checks:
        if hit:
            return f"{ip} is a {name} address"
    return None


class Allowlist:
    """Host names, addresses and CIDR blocks that webhooks may reach although internal."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.hosts: set[str] = set()
        self.networks: list[IPNetwork] = []
        for entry in (e.strip() for e in entries):
            if not entry:
                continue
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.hosts.add(entry.lower().rstrip("."))

    def admits_host(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def admits_ip(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self.networks)


@dataclass(frozen=True, slots=True)
class Target:
    """A checked URL and the address to connect to."""

    url: httpx.URL
    ip: str

    def request_url(self) -> httpx.URL:
        """The URL with the checked address in place of the host name."""
        return self.url.copy_with(host=self.ip)

    def headers(self) -> dict[str, str]:
        return {"Host": self.url.netloc.decode("ascii")}

    def extensions(self) -> dict[str, str]:
        return {"sni_hostname": self.url.host} if self.url.scheme == "https" else {}


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


async def check_url(raw: str, allow: Allowlist) -> Target:
    """Check ``raw`` and pick the address to connect to; raise :class:`UrlRefused`."""
    url = parse_url(raw)
    port = url.port or (443 if url.scheme == "https" else 80)
    addresses = await resolve(url.host, port)
    if not addresses:
        raise UrlRefused(f"{url.host} resolves to no address")
    if not allow.admits_host(url.host):
        for ip in addresses:
            reason = forbidden_reason(ip)
            if reason and not allow.admits_ip(ip):
                raise UrlRefused(f"{url.host} refused: {reason} (not in the webhook allowlist)")
    return Target(url=url, ip=str(addresses[0]))
