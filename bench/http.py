"""A lean HTTP/1.1 load client: one keep-alive connection per simulated user.

httpx's connection pool is not made for hundreds of connections from one process: its CPU
per request grows with them, and on a 2-core machine the generator, not the API, would set
the rate. This client does only what a load generator needs: write a
POST on its own connection, read the status line, headers and ``Content-Length`` body.
It speaks to our own API on loopback and nothing else.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class HttpError(RuntimeError):
    """The connection broke or the answer was not HTTP/1.1 with a length."""


class Connection:
    """One keep-alive connection; ``post`` one request at a time."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host = host
        self.port = port
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"Host: {host}:{port}\r\nContent-Type: application/json\r\n{extra}"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        """Send one JSON POST; (status, body). Reconnects once if the server closed the socket."""
        data = json.dumps(payload).encode()
        request = f"POST {path} HTTP/1.1\r\n{self._head}Content-Length: {len(data)}\r\n\r\n".encode() + data
        for attempt in (1, 2):
            if self._writer is None:
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            try:
                assert self._reader is not None
                self._writer.write(request)
                return await self._response(self._reader)
            except (OSError, asyncio.IncompleteReadError, HttpError):
                await self.close()
                if attempt == 2:
                    raise
        raise HttpError("unreachable")

    async def _response(self, reader: asyncio.StreamReader) -> tuple[int, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise HttpError(f"not an HTTP/1.x status line: {lines[0]!r}")
        length = None
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if length is None:
            raise HttpError("response without Content-Length")
        body = await reader.readexactly(length)
        if close:
            await self.close()
        return int(parts[1]), body

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        self._reader = self._writer = None
