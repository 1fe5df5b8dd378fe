"""``python -m bench.receiver PORT``: a webhook receiver that answers every POST at once.

Raw HTTP/1.1 on asyncio streams, keep-alive, ``200`` with a two-byte body; it counts the
requests and the connections it accepted, and answers ``GET /count`` with
``{"posts": N, "connections": M, "at": {path: when its last POST came}}`` (those GETs counted
in neither). A POST to a path under ``/slow`` is answered after ``SLOW_S``. Loopback only.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

SLOW_S = 2.0
counts: dict[str, Any] = {"posts": 0, "connections": 0, "at": {}}


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    counted = False
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(_length(head))
            if head.startswith(b"GET /count"):
                body = json.dumps(counts).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            else:
                if not counted:
                    counts["connections"] += 1
                    counted = True
                counts["posts"] += 1
                path = head.split(b" ", 2)[1].decode()
                counts["at"][path] = time.time()
                if path.startswith("/slow"):
                    await asyncio.sleep(SLOW_S)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
