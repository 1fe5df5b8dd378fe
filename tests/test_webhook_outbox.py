"""The webhook outbox: deliveries claimed in batches from a line per tenant, sent over keep-alive
HTTP/1.1, settled in batches.

- a worker killed mid-delivery leaves it to the next worker, sent again with the same
  ``webhook-id`` once its lease ends (at least once);
- a delivery queued as an arq job by a producer from before the outbox is adopted and sent;
- over TLS, the client checks the receiver's certificate against the URL's host name;
- one tenant's backlog waits in the worker, capped, while another tenant's callback goes out.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from arq.constants import job_key_prefix
from arq.jobs import serialize_job

from producer import Client
from producer.contract import WEBHOOK_TASK, Delivery, Keys, add_delivery, pack_job, webhook_id_for
from producer.contract.redis import connect
from tests.conftest import WorkerFactory
from tests.fixtures_api import Receiver
from workers.core.metrics import WEBHOOK_HELD
from workers.delivery import Outbox, Webhooks, WebhookSettings
from workers.delivery.http1 import Http1Pool

EMBED = {"model": "all-MiniLM-L6-v2", "input": "outbox"}
LEASE_S = 2.0


async def delivered(client: Client, job_id: str, timeout: float = 30.0) -> dict[str, str]:
    """The job's delivery state once it is ``delivered`` (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = await client.redis.hgetall(client.keys.webhook(job_id))
        if state.get("state") == "delivered":
            return state
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job_id}: not delivered within {timeout}s")


async def test_a_worker_killed_mid_delivery_leaves_it_to_the_next_with_the_same_webhook_id(
    client: Client, start_worker: WorkerFactory, receiver: Receiver
) -> None:
    env = {
        "webhook_allow_hosts": f"127.0.0.1:{receiver.port}",
        "webhook_lease_s": LEASE_S,
        "webhook_timeout_s": 1.5,
    }
    path = receiver.new_path()
    receiver.slow(path, 30.0)  # the first worker's POST hangs until it is killed
    first = start_worker(**env)
    job = await client.submit("embed", EMBED, webhook={"url": receiver.url(path)})
    deadline = time.monotonic() + 20
    while not receiver.active.get(path) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert receiver.active.get(path), "the first worker never started the POST"
    first.kill()
    receiver.slow(path, 0)
    start_worker(**env)
    state = await delivered(client, job)
    got = receiver.on(path)
    assert {r.headers["webhook-id"] for r in got} == {webhook_id_for(job)}
    assert got[-1].json()["id"] == job and state["webhook_id"] == webhook_id_for(job)


async def test_a_delivery_queued_before_the_outbox_is_adopted_and_sent(
    client: Client, start_worker: WorkerFactory, receiver: Receiver
) -> None:
    path = receiver.new_path()
    job_id = "job_" + "0" * 24
    delivery = Delivery(
        webhook_id=webhook_id_for(job_id), job_id=job_id, tenant="default",
        url=receiver.url(path), body='{"id": "job_000000000000000000000000"}',
    )  # fmt: skip
    now_ms = int(time.time() * 1000)
    data = serialize_job(
        WEBHOOK_TASK, (delivery.model_dump(mode="json"),), {}, None, now_ms, serializer=pack_job
    )
    await client.redis.psetex(job_key_prefix + "wh_legacy" + job_id[-6:], 60_000, data)
    await client.redis.zadd(client.keys.webhooks(), {"wh_legacy" + job_id[-6:]: now_ms})
    start_worker(webhook_allow_hosts=f"127.0.0.1:{receiver.port}")
    (got,) = await receiver.wait_for(path, 1)
    assert got.headers["webhook-id"] == delivery.webhook_id and got.body == delivery.body.encode()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for ``localhost``."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


async def test_over_tls_the_receivers_certificate_must_name_the_urls_host(
    certificate: tuple[Path, Path],
) -> None:
    cert, key = certificate
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    pool = Http1Pool(ssl.create_default_context(cafile=str(cert)))
    async with server:
        answer = await pool.post(
            "https", "127.0.0.1", port, "localhost", b"/h", b"host: localhost\r\n", b"{}", 5
        )
        assert answer.status_code == 204
        with pytest.raises(ssl.SSLCertVerificationError):  # the same address, another host name
            await pool.post("https", "127.0.0.1", port, "other.example", b"/h", b"host: x\r\n", b"{}", 5)
    await pool.aclose()


async def test_one_tenants_backlog_waits_in_the_worker_while_another_tenants_callback_goes_out(
    redis_url: str, receiver: Receiver
) -> None:
    """In one process: tenant A's 40 callbacks hang at its receiver; A holds its cap of 8 POSTs
    and at most 32 of its deliveries, the rest stay in the outbox, and B's one goes out at once."""
    redis = connect(redis_url)
    keys = Keys("t-ob-" + secrets.token_hex(3))
    webhooks = Webhooks(redis, keys, WebhookSettings(webhook_allow_hosts=f"127.0.0.1:{receiver.port}"))
    outbox = Outbox(webhooks)
    slow, fast = receiver.new_path(), receiver.new_path()
    receiver.slow(slow, 5.0)
    loop = asyncio.create_task(outbox.run())
    try:
        async with redis.pipeline(transaction=True) as pipe:
            for n in range(40):
                add_delivery(pipe, keys, _delivery("acme", receiver.url(slow), n))
            await pipe.execute()
        await _until_true(lambda: receiver.active.get(slow, 0) == 8)
        await asyncio.sleep(0.3)
        assert WEBHOOK_HELD.labels("sending")._value.get() == 8
        assert WEBHOOK_HELD.labels("waiting")._value.get() == 24  # its backlog here: 4 per slot it may hold
        assert await redis.zcount(keys.outbox() + "t:acme", "-inf", int(time.time() * 1000)) == 8
        async with redis.pipeline(transaction=True) as pipe:
            add_delivery(pipe, keys, _delivery("globex", receiver.url(fast), 0))
            await pipe.execute()
        started = time.monotonic()
        await receiver.wait_for(fast, 1, timeout=5)
        assert time.monotonic() - started < 1.0
        assert receiver.peak[slow] == 8
    finally:
        receiver.slow(slow, 0)
        loop.cancel()
        await outbox.aclose(0.1)
        await webhooks.aclose()
        await redis.aclose()


def _delivery(tenant: str, url: str, n: int) -> Delivery:
    job_id = f"job_{secrets.token_hex(8)}{n}"
    return Delivery(webhook_id=webhook_id_for(job_id), job_id=job_id, tenant=tenant, url=url, body="{}")


async def _until_true(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
