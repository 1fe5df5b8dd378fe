"""A small HTTP/1.1 client for webhook POSTs: keep-alive connections to checked addresses.

Webhooks need one request shape (a POST with a body, no redirects, no cookies, no proxies) to an
address the SSRF guard pinned, at the rate jobs finish. A general client spent most of a
delivery's CPU (docs/benchmarks.md has the profile); this one writes the request in one call
and parses only the status line and headers. Connections are kept per (scheme, address, port,
TLS server name), so a connection verified for one host name never carries another's request.
An answer's body is read only as far as needed to reuse its connection (``DRAIN_BYTES`` within
``DRAIN_S``); otherwise the connection is closed, never waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field

HEAD_MAX = 64 * 1024  # status line and headers of an answer, at most
DRAIN_BYTES = 64 * 1024  # of a receiver's answer, read so its connection is reused
DRAIN_S = 0.5  # at most this long
IDLE_PER_KEY = 64  # idle connections kept per (scheme, address, port, server name): a worker's slots


class ProtocolError(OSError):
    """The receiver's answer is not HTTP/1.1 this client can read."""


@dataclass(slots=True)
class Answer:
    """A receiver's answer: status and headers (names lower-cased; the last of a repeated one)."""

    status_code: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


Key = tuple[str, str, int, str | None]


class Http1Pool:
    """Keep-alive connections; ``post`` sends one request and returns the answer's head."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.idle: dict[Key, list[_Connection]] = {}
        self._tls = tls or ssl.create_default_context()  # the system's CAs, host names checked

    async def post(
        self,
        scheme: str,
        ip: str,
        port: int,
        server_name: str | None,
        target: bytes,
        head: bytes,
        body: bytes,
        timeout_s: float,
    ) -> Answer:
        """POST ``body`` to ``target`` (path and query) with the header block ``head``.

        ``timeout_s`` bounds connecting and the answer's head (TimeoutError); the body is then
        drained within ``DRAIN_S`` or its connection closed. A pooled connection found closed
        before any answer came is replaced once by a new one (deliveries are at least once,
        with one ``webhook-id``).
        """  # fmt: skip
        key: Key = (scheme, ip, port, server_name if scheme == "https" else None)
        request = b"POST %s HTTP/1.1\r\n%scontent-length: %d\r\n\r\n%s" % (target, head, len(body), body)
        async with asyncio.timeout(timeout_s):
            conn, answer, keep = await self._exchange(key, request)
        if keep and await _drain(conn.reader, answer) and conn.usable():
            self._give_back(key, conn)
        else:
            conn.close()
        return answer

    async def _exchange(self, key: Key, request: bytes) -> tuple[_Connection, Answer, bool]:
        conn = self._take(key)
        if conn is not None:
            try:
                return conn, *await _send(conn, request)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                if getattr(exc, "partial", b""):  # an answer had begun: not a stale connection
                    raise ConnectionError(f"the receiver broke off its answer: {exc!r}") from exc
        conn = await self._open(key)
        try:
            return conn, *await _send(conn, request)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionError("the receiver closed the connection without an answer") from exc

    def _take(self, key: Key) -> _Connection | None:
        pool = self.idle.get(key)
        while pool:
            conn = pool.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _give_back(self, key: Key, conn: _Connection) -> None:
        pool = self.idle.setdefault(key, [])
        if len(pool) < IDLE_PER_KEY:
            pool.append(conn)
        else:
            conn.close()

    async def _open(self, key: Key) -> _Connection:
        scheme, ip, port, server_name = key
        tls = self._tls if scheme == "https" else None
        reader, writer = await asyncio.open_connection(
            ip, port, ssl=tls, server_hostname=server_name if tls else None, limit=HEAD_MAX
        )
        return _Connection(reader, writer)

    async def aclose(self) -> None:
        for pool in self.idle.values():
            for conn in pool:
                conn.close()
        self.idle.clear()


async def _send(conn: _Connection, request: bytes) -> tuple[Answer, bool]:
    """Write the request and read the answer's head; the connection is closed on any failure."""
    try:
        conn.writer.write(request)
        return await _read_head(conn.reader)
    except BaseException:
        conn.close()
        raise


async def _read_head(reader: asyncio.StreamReader) -> tuple[Answer, bool]:
    """The answer's status and headers (skipping 1xx); whether the connection may be kept."""
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as exc:
            raise ProtocolError("the answer's headers are too long") from exc
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if not 100 <= status < 200:
            break
    keep = parts[0] == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    return Answer(status, headers), keep


async def _drain(reader: asyncio.StreamReader, answer: Answer) -> bool:
    """Read a short body to its end, so the connection can be reused; False: close it instead."""
    if answer.status_code in (204, 304):
        return True
    try:
        async with asyncio.timeout(DRAIN_S):
            if "chunked" in answer.headers.get("transfer-encoding", "").lower():
                return await _drain_chunked(reader)
            length = answer.headers.get("content-length")
            if length is None or not length.isdigit() or int(length) > DRAIN_BYTES:
                return False  # read until close, or too long: not worth the wait
            await reader.readexactly(int(length))
            return True
    except (
        TimeoutError,
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
        ValueError,
        ConnectionError,
    ):
        return False


async def _drain_chunked(reader: asyncio.StreamReader) -> bool:
    read = 0
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            with contextlib.suppress(asyncio.IncompleteReadError):
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the blank line
                    pass
            return True
        read += size
        if read > DRAIN_BYTES:
            return False
        await reader.readexactly(size + 2)
