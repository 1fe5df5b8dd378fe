"""Connections to Redis, one Redis or a Sentinel-monitored primary, for every process.

Two ways to name a Sentinel deployment, equivalent:

- the URL form, accepted wherever a Redis URL is (``OVERSPILL_REDIS_URL``, ``--redis-url``,
  ``Client(url)``): ``redis+sentinel://[user:password@]host:port[,host:port…]/MASTER[/DB]``;
- ``OVERSPILL_REDIS_SENTINELS=host:port,host:port,…`` with ``OVERSPILL_REDIS_SENTINEL_MASTER``,
  which then replace the host of a plain ``redis://`` URL (its user, password and db stay).

Passwords: the URL's user and password (or ``OVERSPILL_REDIS_PASSWORD_FILE``) are the primary's
and the replicas' (``requirepass``). Sentinels with a password of their own (their
``requirepass``) take ``OVERSPILL_REDIS_SENTINEL_PASSWORD`` (or ``…_SENTINEL_PASSWORD_FILE``, a
mounted secret) and ``OVERSPILL_REDIS_SENTINEL_USERNAME`` for an ACL user; sentinels without
one must be given none (Redis refuses AUTH where no password is set).

A Sentinel client asks the sentinels for the primary's address on every new connection, and a
connection to a primary that died or became a replica is dropped, so after a failover each
process reaches the new primary without a restart. Commands of :func:`connect`'s clients retry
for ``reconnect_s`` meanwhile; the workers' arq loops retry on their own.

Replication is asynchronous: a write acknowledged by a primary that dies before a replica has
it is lost. ``OVERSPILL_REDIS_WAIT_REPLICAS=N`` makes every transaction (a submission) wait
for ``N`` replicas (Redis ``WAIT``) for up to ``OVERSPILL_REDIS_WAIT_TIMEOUT_MS``; fewer acks
raise :class:`NotReplicated`, so the caller was never told "accepted" for a write that may vanish.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from arq.connections import ArqRedis, RedisSettings, create_pool
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .keys import redis_url_with_secret

try:
    import hiredis
except ImportError:  # redis[hiredis] is a dependency; without it the Python packer stays
    hiredis = None

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
# A sentinel that does not answer within this is skipped for the next one.
SENTINEL_TIMEOUT_S = 0.5


class RedisConnectionSettings(BaseSettings):
    """How every process reaches Redis beyond its URL (``OVERSPILL_REDIS_*`` variables)."""

    model_config = SettingsConfigDict(env_prefix="OVERSPILL_REDIS_", extra="ignore")

    sentinels: str = ""  # host:port,host:port,… (a plain redis:// URL's host is then ignored)
    sentinel_master: str = "mymaster"
    wait_replicas: int = Field(default=0, ge=0)  # 0: acknowledged by the primary alone
    wait_timeout_ms: int = Field(default=1000, ge=1)  # WAIT 0 would block forever: not allowed
    reconnect_s: float = Field(default=10.0, ge=0)  # commands retry this long across a failover
    password_file: Path | None = None  # read by redis_url_with_secret; kept out of the URL
    sentinel_username: str | None = None
    sentinel_password: SecretStr | None = None  # the sentinels' own requirepass
    sentinel_password_file: Path | None = None  # a mounted secret; wins over sentinel_password

    def sentinel_auth(self) -> dict[str, str]:
        """``username``/``password`` keywords for connections to the sentinels (empty: none)."""
        auth: dict[str, str] = {}
        if self.sentinel_password_file is not None:
            auth["password"] = self.sentinel_password_file.read_text(encoding="utf-8").strip()
        elif self.sentinel_password is not None:
            auth["password"] = self.sentinel_password.get_secret_value()
        if self.sentinel_username and auth:
            auth["username"] = self.sentinel_username
        return auth


class NotReplicated(RedisError):
    """A transaction reached fewer replicas than ``wait_replicas`` in time; it may be lost."""


@dataclass(frozen=True)
class RedisTarget:
    """Where a URL (and the settings) point: one server, or a master behind sentinels."""

    url: str  # the plain URL (password included) when there are no sentinels
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_auth: tuple[tuple[str, str], ...] = ()  # username/password for the sentinels

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)


def parse_hosts(text: str) -> tuple[tuple[str, int], ...]:
    """``"a:26379,b,[::1]:1"`` → ``(("a", 26379), ("b", 26379), ("::1", 1))``."""
    hosts = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        host, sep, port = entry.rpartition(":") if not entry.endswith("]") else (entry, "", "")
        if not sep:
            host, port = entry, str(DEFAULT_SENTINEL_PORT)
        if not host or not port.isdigit():
            raise ValueError(f"a sentinel is host:port, not {entry!r}")
        hosts.append((host.strip("[]"), int(port)))
    return tuple(hosts)


def redis_target(url: str, settings: RedisConnectionSettings | None = None) -> RedisTarget:
    """Resolve ``url`` (with the password file applied) and the Sentinel settings."""
    s = settings or RedisConnectionSettings()
    full = redis_url_with_secret(url)
    parts = urlsplit(full)
    user, password = _credentials(parts.netloc)
    if parts.scheme == SENTINEL_SCHEME:
        master, _, db = parts.path.strip("/").partition("/")
        if not master:
            raise ValueError(f"a {SENTINEL_SCHEME}:// URL names its master: …/MASTER[/DB]")
        hosts = parse_hosts(parts.netloc.rpartition("@")[2])
        auth = tuple(s.sentinel_auth().items())
        return RedisTarget(full, hosts, master, int(db or 0), user, password, auth)
    if s.sentinels:
        db = parts.path.strip("/") or "0"
        auth = tuple(s.sentinel_auth().items())
        return RedisTarget(full, parse_hosts(s.sentinels), s.sentinel_master, int(db), user, password, auth)
    return RedisTarget(full)


def _credentials(netloc: str) -> tuple[str | None, str | None]:
    userinfo, at, _ = netloc.rpartition("@")
    if not at:
        return None, None
    user, _, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) or None)


def failover_retry(reconnect_s: float) -> Retry:
    """Retries of a failed command, backing off 50 ms doubling to 1 s, for about ``reconnect_s``."""
    backoff = ExponentialBackoff(cap=1.0, base=0.05)
    retries, total = 0, 0.0
    while total < reconnect_s:
        retries += 1
        total += backoff.compute(retries)
    return Retry(backoff, retries)


# Values that are not UTF-8 (result blocks, chunk location maps: contract/blocks.py) come back
# as text that encodes to the same bytes again with this handler (a no-op for UTF-8 values).
BINARY_SAFE = "surrogateescape"


def connect(
    url: str, settings: RedisConnectionSettings | None = None, *, decode_responses: bool = True
) -> aioredis.Redis:
    """An asyncio Redis client for ``url``: a plain server, or the master behind sentinels."""
    s = settings or RedisConnectionSettings()
    target = redis_target(url, s)
    if not target.is_sentinel:
        client = ReplicatedRedis.from_url(
            target.url, decode_responses=decode_responses, encoding_errors=BINARY_SAFE
        )
    else:
        client = _sentinel(target).master_for(
            target.master,
            redis_class=ReplicatedRedis,
            db=target.db,
            username=target.username,
            password=target.password,
            decode_responses=decode_responses,
            encoding_errors=BINARY_SAFE,
            socket_connect_timeout=1.0,
            retry=failover_retry(s.reconnect_s),
        )
    client.wait_replicas = s.wait_replicas
    client.wait_timeout_ms = s.wait_timeout_ms
    pool = client.connection_pool
    pool.connection_class = _hiredis_packing(pool.connection_class)
    return client


class _HiredisPacking:
    """Commands packed by hiredis's C packer: redis-py's asyncio connections pack in Python,
    which was 8 % of a client's CPU and 4 % of a worker's under load (the bytes are the same)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):  # "CONFIG GET" as redis-py splits it
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # a value redis-py refuses: its own packer raises its own error
            return super().pack_command(*args)  # type: ignore[misc,no-any-return]


@functools.cache
def _hiredis_packing(connection_class: type) -> type:
    """``connection_class`` (plain, TLS, Unix socket, sentinel-managed) packing with hiredis."""
    if hiredis is None or not hasattr(hiredis, "pack_command"):
        return connection_class
    return type(connection_class.__name__, (_HiredisPacking, connection_class), {})


def _sentinel(target: RedisTarget) -> Sentinel:
    return Sentinel(
        list(target.sentinels),
        sentinel_kwargs={
            "socket_connect_timeout": SENTINEL_TIMEOUT_S,
            "socket_timeout": SENTINEL_TIMEOUT_S,
            **dict(target.sentinel_auth),
        },
    )


@dataclass
class SentinelRedisSettings(RedisSettings):
    """arq's settings for a Sentinel target, with what arq itself has no field for."""

    target: RedisTarget | None = None


def arq_redis_settings(url: str, settings: RedisConnectionSettings | None = None) -> RedisSettings:
    """arq's ``RedisSettings`` for the same target (workers and their arq pools).

    Open pools with :func:`create_arq_pool`: arq's own ``create_pool`` cannot authenticate to
    sentinels.
    """
    s = settings or RedisConnectionSettings()
    target = redis_target(url, s)
    if target.is_sentinel:
        return SentinelRedisSettings(
            host=list(target.sentinels),
            sentinel=True,
            sentinel_master=target.master,
            database=target.db,
            username=target.username,
            password=target.password,
            target=target,
        )
    arq = RedisSettings.from_dsn(target.url)
    if arq.password:  # arq keeps it percent-encoded; redis-py decodes it
        arq.password = unquote(arq.password)
    return arq


async def create_arq_pool(settings: RedisSettings, **kwargs: Any) -> ArqRedis:
    """arq's ``create_pool``, but a Sentinel target's pool is built here, as arq builds it, with
    the sentinels' own credentials (arq gives its credentials to the primary only).

    No command retry is added: arq's loops handle a failed command themselves, and a retried
    claim or lease renewal could run twice."""
    if not isinstance(settings, SentinelRedisSettings) or settings.target is None:
        return await create_pool(settings, **kwargs)
    target = settings.target
    pool = _sentinel(target).master_for(
        target.master,
        redis_class=ArqRedis,
        db=target.db,
        username=target.username,
        password=target.password,
        encoding="utf8",
    )
    pool.job_serializer = kwargs.get("job_serializer")
    pool.job_deserializer = kwargs.get("job_deserializer")
    if "default_queue_name" in kwargs:
        pool.default_queue_name = kwargs["default_queue_name"]
    if "expires_extra_ms" in kwargs:
        pool.expires_extra_ms = kwargs["expires_extra_ms"]
    attempt = 0
    while True:  # as arq's create_pool: a few tries, a pause between them
        try:
            await pool.ping()
            return pool
        except (TimeoutError, RedisError, OSError):
            if attempt >= settings.conn_retries:
                await pool.aclose()
                raise
            attempt += 1
            await asyncio.sleep(settings.conn_retry_delay)


class ReplicatedRedis(aioredis.Redis):
    """``redis.asyncio.Redis`` whose transactions wait for ``wait_replicas`` replicas."""

    wait_replicas: int = 0
    wait_timeout_ms: int = 1000

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        if not (transaction and self.wait_replicas):
            return super().pipeline(transaction, shard_hint)
        pipe = ReplicatedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.wait_replicas, pipe.wait_timeout_ms = self.wait_replicas, self.wait_timeout_ms
        return pipe


class ReplicatedPipeline(Pipeline):
    """A transaction followed by ``WAIT`` on the same connection (WAIT counts that connection's writes)."""

    wait_replicas: int = 0
    wait_timeout_ms: int = 1000

    async def _execute_transaction(self, connection: Any, commands: Any, raise_on_error: bool) -> Any:
        result = await super()._execute_transaction(connection, commands, raise_on_error)
        try:
            await connection.send_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            acked = int(await connection.read_response())
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            # Not retried: the transaction ran, so running it again would duplicate it.
            await connection.disconnect()
            raise NotReplicated(
                f"the primary was lost before {self.wait_replicas} replica(s) acknowledged"
            ) from exc
        if acked < self.wait_replicas:
            raise NotReplicated(
                f"{acked} of {self.wait_replicas} replica(s) acknowledged within {self.wait_timeout_ms} ms"
            )
        return result
