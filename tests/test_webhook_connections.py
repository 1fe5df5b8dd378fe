"""Webhook deliveries keep their connections, and reading an answer never makes it a timeout.

The worker's delivery code against a raw HTTP/1.1 receiver of this process on loopback, which
counts the connections it accepts; real Redis for the delivery states.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from producer.contract import Delivery, Keys
from producer.contract.redis import connect
from workers.delivery import WebhookSettings
from workers.delivery.http1 import DRAIN_S
from workers.delivery.webhooks import Webhooks

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Receiver:
    port: int
    connections: int = 0
    posts: int = 0


async def small_answer(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok")


async def endless_answer(writer: asyncio.StreamWriter) -> None:
    """200 and a body that says 10 MB, of which a few bytes come, then nothing."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10000000\r\n\r\nstart")
    await writer.drain()
    await asyncio.sleep(30)


async def serve(answer: Answer) -> tuple[asyncio.Server, Receiver]:
    receiver = Receiver(port=0)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        receiver.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                receiver.posts += 1
                await answer(writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    receiver.port = server.sockets[0].getsockname()[1]
    return server, receiver


@pytest.fixture
async def webhooks_for(redis_url: str) -> AsyncIterator[Callable[[int], Webhooks]]:
    redis = connect(redis_url)
    keys = Keys("t-whc-" + secrets.token_hex(3))
    made: list[Webhooks] = []

    def make(port: int) -> Webhooks:
        made.append(Webhooks(redis, keys, WebhookSettings(webhook_allow_hosts=f"127.0.0.1:{port}")))
        return made[-1]

    yield make
    for w in made:
        await w.aclose()
    await redis.aclose()


def delivery(port: int, n: int) -> Delivery:
    job_id = f"job_{secrets.token_hex(8)}"
    return Delivery(
        webhook_id=f"msg_{job_id}", job_id=job_id, tenant="default",
        url=f"http://127.0.0.1:{port}/hook/{n}", body='{"status": "succeeded"}',
    )  # fmt: skip


async def test_deliveries_to_one_receiver_share_one_connection(
    webhooks_for: Callable[[int], Webhooks],
) -> None:
    server, receiver = await serve(small_answer)
    async with server:
        webhooks = webhooks_for(receiver.port)
        outcomes = [await webhooks.deliver(delivery(receiver.port, n)) for n in range(5)]
    assert outcomes == ["delivered"] * 5 and receiver.posts == 5
    assert receiver.connections == 1  # each answer read to its end: the connection went back to the pool


async def test_an_answer_whose_body_never_ends_is_delivered_without_waiting_for_it(
    webhooks_for: Callable[[int], Webhooks],
) -> None:
    server, receiver = await serve(endless_answer)
    async with server:
        webhooks = webhooks_for(receiver.port)
        started = time.monotonic()
        outcome = await webhooks.deliver(delivery(receiver.port, 0))
        took = time.monotonic() - started
    assert outcome == "delivered"  # the status counts, not the body
    assert took < DRAIN_S + 2.0  # the body is given up on after DRAIN_S, far inside the 5 s timeout
