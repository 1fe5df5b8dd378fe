"""Tenants: API keys to tenants, and each tenant's request rate and queued-jobs limits.

Tenants are defined in the tenants file (``OVERSPILL_TENANTS_FILE``, JSON, the format is
``producer.contract.TenantsFile``), which the workers read too, for webhook secrets. API keys are
stored there only as SHA-256 digests (``overspill api-key`` makes a key and its digest); the
file is re-read when it changes, so keys and secrets rotate without a restart. A change is any
new inode, size or mtime: an in-place write, a rename over it, or a Kubernetes Secret mount's
symlink swap (``os.stat`` follows the link). A new file that does not parse is logged as an
error and the last good one stays in force.

Limits live in Redis so that several API processes share them:

- the request rate is a token bucket per tenant (one atomic script);
- queued jobs are the tenant's jobs not yet terminal, kept in a sorted set; when it looks
  full, its terminal entries are pruned before a submission is refused. Submissions from
  several API processes at once can overshoot the limit by their number: it is a guard, not
  an invariant.

Requests of one tenant handled at the same time share their checks (:class:`SameTick`): one
script call takes as many tokens as there are requests and admits that many, in order.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from ..contract import TERMINAL, Keys, TenantSpec, hash_api_key, load_tenants
from ..errors import RateLimited, Unauthorized
from .ticks import SameTick

log = structlog.get_logger("producer.api")

ANONYMOUS = TenantSpec(name="default")
# The tenants file is looked at (one stat) at most this often, not on every request.
RELOAD_CHECK_S = 1.0

# KEYS: bucket. ARGV: rate per s, burst, now, requests. Takes one token per request while
# there are whole tokens; returns {requests admitted, seconds until the next token}.
LUA_TOKEN_BUCKET = """
local rate, burst, now, wanted = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local admitted = math.min(wanted, math.floor(tokens))
tokens = tokens - admitted
local wait = 0
if admitted < wanted then wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return {admitted, tostring(wait)}
"""


class TenantRegistry:
    """Looks up the tenant of a bearer token; re-reads the tenants file when it changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None  # (inode, size, mtime ns) of the loaded file
        self._checked = float("-inf")
        self._by_digest: dict[str, TenantSpec] = {}
        self._by_name: dict[str, TenantSpec] = {}
        if path is not None:
            self._reload(strict=True)

    @property
    def open(self) -> bool:
        """No tenants file: every request is the anonymous tenant."""
        return self.path is None

    def authenticate(self, authorization: str | None) -> TenantSpec:
        if self.open:
            return ANONYMOUS
        self._reload(strict=False)
        if not authorization:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized(
                "malformed Authorization header: expected 'Bearer <key>'", code="invalid_api_key"
            )
        tenant = self._by_digest.get(hash_api_key(token.strip()))
        if tenant is None:
            raise Unauthorized("invalid API key", code="invalid_api_key")
        return tenant

    def all(self) -> list[TenantSpec]:
        """Every tenant of the file (the anonymous one when there is none), by name."""
        if self.open:
            return [ANONYMOUS]
        self._reload(strict=False)
        return sorted(self._by_name.values(), key=lambda t: t.name)

    def get(self, name: str) -> TenantSpec | None:
        return ANONYMOUS if self.open and name == ANONYMOUS.name else self._by_name.get(name)

    def _reload(self, *, strict: bool) -> None:
        assert self.path is not None
        now = time.monotonic()
        if not strict and now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if stamp == self._stamp:
                return
            tenants = load_tenants(self.path)
        except (OSError, ValueError) as exc:
            if strict:
                raise
            log.error("tenants file unreadable; keeping the tenants already loaded", error=str(exc)[:300])
            return
        self._by_name = tenants
        self._by_digest = {d: t for t in tenants.values() for d in t.api_key_sha256}
        self._stamp = stamp
        log.info("tenants loaded", tenants=len(tenants))


class RateLimiter:
    """A token bucket per tenant, in Redis; concurrent requests share one script call."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self.keys = keys
        self._script = redis.register_script(LUA_TOKEN_BUCKET)
        self._checks: SameTick[str, TenantSpec, float | None] = SameTick(self._take)

    async def check(self, tenant: TenantSpec) -> None:
        """Return if the request may go on; raise :class:`RateLimited` with a retry delay if not."""
        retry = await self._checks(tenant.name, tenant)
        if retry is not None:
            raise RateLimited(
                f"rate limit of {tenant.rate_per_s:g} requests/s (burst {tenant.burst}) exceeded; "
                f"retry in {retry:.2f}s",
                retry_after_s=retry,
            )

    async def _take(self, name: str, requests: list[TenantSpec]) -> list[float | None]:
        """One token per request, in order: None for the admitted, the retry delay for the rest."""
        tenant = requests[-1]
        admitted, wait = await self._script(
            keys=[self.keys.rate(name)], args=[tenant.rate_per_s, tenant.burst, time.time(), len(requests)]
        )
        n = int(admitted)
        return [None] * n + [float(wait)] * (len(requests) - n)


# KEYS: a tenant's open-jobs set. ARGV: limit, now, ttl, then per check its size and that many
# reservation tokens. Admits checks in order while they fit, adding their tokens in the same
# step, so concurrent API processes cannot both see room for the last slot. 1/0 per check.
LUA_RESERVE = """
local key, limit, now = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local count = redis.call('ZCARD', key)
local out, i = {}, 4
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  if count + n <= limit then
    for j = 1, n do redis.call('ZADD', key, now, ARGV[i + j]) end
    count = count + n
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
  i = i + n + 1
end
redis.call('EXPIRE', key, tonumber(ARGV[3]))
return out
"""
RESERVED = "resv:"  # members that hold a slot for a job being written
RESERVATION_TTL_S = 60.0  # a reservation whose writer died frees its slot after this


class QueueQuota:
    """At most ``tenant.max_queued`` jobs per tenant that are not yet terminal.

    A check reserves its slots atomically (placeholders in the tenant's open-jobs set); the
    written jobs then take their places, or the reservation is released if the write failed.
    """

    def __init__(self, redis: Any, keys: Keys, ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s
        self._reserve = redis.register_script(LUA_RESERVE)
        self._checks: SameTick[str, tuple[TenantSpec, list[str]], bool] = SameTick(self._admit)
        self._tracks: SameTick[str, tuple[Sequence[str], Sequence[str]], None] = SameTick(self._add)

    async def check(self, tenant: TenantSpec, adding: int = 1) -> list[str]:
        """Reserve ``adding`` slots and return their tokens; :class:`RateLimited` if full."""
        tokens = [RESERVED + secrets.token_hex(8) for _ in range(adding)]
        if await self._checks(tenant.name, (tenant, tokens)):
            return tokens
        raise RateLimited(
            f"tenant has {tenant.max_queued} jobs queued or running, its limit; retry when some finish",
            retry_after_s=1.0,
            code="too_many_queued_jobs",
        )

    async def track(self, tenant: TenantSpec, job_ids: Sequence[str], tokens: Sequence[str]) -> None:
        """The written jobs take the places their reservation held."""
        await self._tracks(tenant.name, (job_ids, tokens))

    async def release(self, tenant: TenantSpec, tokens: Sequence[str]) -> None:
        """Free a reservation whose jobs were not written."""
        if tokens:
            await self.redis.zrem(self.keys.open_jobs(tenant.name), *tokens)

    async def _admit(self, name: str, checks: list[tuple[TenantSpec, list[str]]]) -> list[bool]:
        """Reserve for the checks in order while they fit; prune finished jobs if some do not."""
        key = self.keys.open_jobs(name)
        limit = checks[-1][0].max_queued
        args: list[Any] = [limit, time.time(), self.ttl_s]
        for _, tokens in checks:
            args += [len(tokens), *tokens]
        fits = [bool(x) for x in await self._reserve(keys=[key], args=args)]
        if all(fits):
            return fits
        await self._prune(key)
        again = [c for c, ok in zip(checks, fits, strict=True) if not ok]
        args = [limit, time.time(), self.ttl_s]
        for _, tokens in again:
            args += [len(tokens), *tokens]
        retried = iter(bool(x) for x in await self._reserve(keys=[key], args=args))
        return [ok or next(retried) for ok in fits]

    async def _add(self, name: str, groups: list[tuple[Sequence[str], Sequence[str]]]) -> list[None]:
        key = self.keys.open_jobs(name)
        now = time.time()
        tokens = [t for _, ts in groups for t in ts]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {job_id: now for ids, _ in groups for job_id in ids})
            if tokens:
                pipe.zrem(key, *tokens)
            pipe.expire(key, self.ttl_s)
            await pipe.execute()
        return [None] * len(groups)

    async def _prune(self, key: str) -> int:
        """Drop finished (or vanished) jobs and stale reservations; how many stay."""
        entries: list[tuple[str, float]] = await self.redis.zrange(key, 0, -1, withscores=True)
        jobs = [m for m, _ in entries if not m.startswith(RESERVED)]
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in jobs:
                pipe.hget(self.keys.job(job_id), "status")
            statuses = await pipe.execute()
        gone = [m for m, s in zip(jobs, statuses, strict=True) if s is None or s in TERMINAL]
        stale = time.time() - RESERVATION_TTL_S
        gone += [m for m, at in entries if m.startswith(RESERVED) and at < stale]
        if gone:
            await self.redis.zrem(key, *gone)
        return len(entries) - len(gone)
