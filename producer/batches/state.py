"""Batch state: statuses, settings, the batch hash as a typed object, and the Redis scripts
(the batches', and the file store's).

The batch hash (``Keys.batch(id)``) holds strings; :class:`BatchState` reads it back typed
and renders the OpenAI batch object. Every status change goes through ``LUA_TRANSITION``
(a compare-and-set on the status), so a cancel and a driver never overwrite each other.
"""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..contract import LUA_LOCATIONS


class BatchStatus(StrEnum):
    validating = "validating"
    failed = "failed"
    in_progress = "in_progress"
    finalizing = "finalizing"
    completed = "completed"
    expired = "expired"
    cancelling = "cancelling"
    cancelled = "cancelled"


PAGE = 1000  # entries read (and job states checked) per Redis call

ACTIVE = frozenset(
    {BatchStatus.validating, BatchStatus.in_progress, BatchStatus.finalizing, BatchStatus.cancelling}
)


class BatchSettings(BaseSettings):
    """Settings of the batch engine (``OVERSPILL_*``); the API passes its Redis URL and prefix."""

    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "overspill"
    # Relative paths are made absolute when the settings are read, so every message names the
    # one directory used, and a later chdir cannot move the store.
    run_dir: Path = Field(default=Path(".run"), validate_default=True)
    files_dir: Path | None = None  # default: <run_dir>/files
    max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1)
    # Expiry of files (OpenAI's ``expires_after``): outputs expire by default (0 = kept until
    # deleted); uploads may ask for file_expiry_min_s..30 days (the minimum is lowered in tests).
    file_output_expiry_s: int = Field(default=30 * 86400, ge=0)
    file_expiry_min_s: int = Field(default=3600, ge=1, le=30 * 86400)
    file_sweep_s: float = Field(default=30.0, gt=0)  # how often expired files are deleted
    file_sweep_batch: int = Field(default=500, ge=1)  # files deleted per sweep tick at most
    batch_max_lines: int = Field(default=50_000, ge=1)
    batch_max_inputs: int = Field(default=50_000, ge=1)  # embedding inputs over a whole batch
    batch_chunk_lines: int = Field(default=1000, ge=1)  # lines per submission transaction
    # Lines submitted ahead of those already written to the output files: bounds what a batch
    # holds in Redis (queued jobs and results not yet on disk), whatever its size.
    batch_window_lines: int = Field(default=4096, ge=1)
    batch_pack_size: int = Field(default=64, ge=1)  # items per arq job
    batch_poll_s: float = Field(default=0.5, gt=0)
    batch_lease_s: float = Field(default=15.0, gt=0)
    batch_cancel_grace_s: float = Field(default=600.0, ge=0)  # cancelling waits this long for running jobs
    batch_max_step_failures: int = Field(default=5, ge=1)  # crashed steps in a row before the batch fails
    # completion_window → seconds. OpenAI accepts only "24h"; shorter ones are for tests.
    batch_windows: dict[str, float] = Field(default_factory=lambda: {"24h": 86400.0})

    @field_validator("run_dir", "files_dir")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        return None if path is None else Path(os.path.abspath(path))  # folds "..", keeps symlinks

    def directory(self) -> Path:
        """The file store: ``files_dir``, else ``<run_dir>/files``; always absolute."""
        return self.files_dir or self.run_dir / "files"


class BatchState(BaseModel):
    """The batch hash, typed. Absent fields are None or zero."""

    model_config = ConfigDict(extra="ignore")

    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: float
    expires_at: float
    out_file: str
    err_file: str
    metadata: str | None = None  # JSON
    errors: str | None = None  # JSON list of LineError
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    submitted: int = 0  # request lines submitted (their entries recorded)
    offset: int = 0  # byte offset in the input file after the last submitted line
    scan_at: int = 0  # entries below this are all finished ...
    scan_ok: int = 0  # ... this many of them succeeded,
    scan_failed: int = 0  # ... this many did not
    routes: str | None = None  # JSON {local, remote, cache} over the scanned successes
    completed: int = 0
    failed: int = 0
    cancel_sent: int = 0
    written_at: int = 0  # entries below this are in the output/error .part files ...
    out_bytes: int = 0  # ... which then hold this many bytes,
    err_bytes: int = 0
    written_out: int = 0  # ... and this many lines
    written_err: int = 0

    def public(self) -> dict[str, Any]:
        """The OpenAI batch object (openai-python ``types/batch.py``), plus an ``overspill`` field."""

        def ts(v: float | None) -> int | None:
            return None if v is None else int(v)

        errors = json.loads(self.errors) if self.errors else None
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": errors} if errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": int(self.created_at),
            "in_progress_at": ts(self.in_progress_at),
            "expires_at": ts(self.expires_at),
            "finalizing_at": ts(self.finalizing_at),
            "completed_at": ts(self.completed_at),
            "failed_at": ts(self.failed_at),
            "expired_at": ts(self.expired_at),
            "cancelling_at": ts(self.cancelling_at),
            "cancelled_at": ts(self.cancelled_at),
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": json.loads(self.metadata) if self.metadata else None,
            "overspill": {"submitted": self.submitted, "routes": self.route_counts()},
        }

    def route_counts(self) -> dict[str, int]:
        return json.loads(self.routes) if self.routes else {"local": 0, "remote": 0, "cache": 0}


# ---------------------------------------------------------------------------- scripts

# KEYS: batch. ARGV: allowed current statuses (comma-separated), then field, value pairs.
# Returns 1 if the status was one of them (and the fields were set), else 0.
LUA_TRANSITION = """
local s = redis.call('HGET', KEYS[1], 'status')
if not s then return 0 end
for allowed in string.gmatch(ARGV[1], '[^,]+') do
  if allowed == s then
    if #ARGV > 1 then redis.call('HSET', KEYS[1], unpack(ARGV, 2)) end
    return 1
  end
end
return 0
"""

# KEYS: one per job, its record or its chunk's; ARGV: per job '' (a record of its own) or its
# index in the chunk. One character per job: '.' not finished, 'S' succeeded, 'F' failed,
# cancelled or expired, 'X' record gone.
LUA_STATES = (
    LUA_LOCATIONS
    + """
local out = {}
local maps = {}  -- chunk key -> its location field x, read once per call
local function where(key, index)
  if maps[key] == nil then maps[key] = redis.call('HGET', key, 'x') or false end
  return located(maps[key] or nil, tonumber(index))
end
for i, key in ipairs(KEYS) do
  local s
  if ARGV[i] == '' then
    s = redis.call('HGET', key, 'status')
  else
    local k = where(key, ARGV[i])
    if k == IN_ENVELOPE then
      local r = redis.call('HGET', key, 'r' .. ARGV[i])
      s = r and (string.match(string.sub(r, 1, 512), '"status":"(%a+)"') or 'failed') or 'failed'
    elseif k ~= 0 then s = 'succeeded'  -- a row of a result block
    elseif redis.call('EXISTS', key) == 1 then s = 'queued' end
  end
  if not s then out[i] = 'X'
  elseif s == 'succeeded' then out[i] = 'S'
  elseif s == 'queued' or s == 'running' then out[i] = '.'
  else out[i] = 'F' end
end
return table.concat(out)
"""
)

# KEYS and ARGV as for LUA_STATES, of succeeded jobs. One character per job: its route 'L'ocal,
# 'R'emote, 'C'ache, '?'.
LUA_ROUTES = (
    LUA_LOCATIONS
    + """
local codes = {['local'] = 'L', remote = 'R', cache = 'C'}
local out = {}
for i, key in ipairs(KEYS) do
  local r
  if ARGV[i] == '' then r = redis.call('HGET', key, 'result')
  elseif located(redis.call('HGET', key, 'x') or nil, tonumber(ARGV[i])) ~= IN_ENVELOPE then
    r = '"route":"local"'  -- a row of a result block: blocks run locally
  else r = redis.call('HGET', key, 'r' .. ARGV[i]) end
  local route = r and string.match(string.sub(r, 1, 512), '"route":"(%a+)"')
  out[i] = (route and codes[route]) or '?'
end
return table.concat(out)
"""
)

LUA_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

LUA_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

ROUTE_NAMES = {"L": "local", "R": "remote", "C": "cache"}

# Files (producer/batches/files.py): registered with their tenant's byte count, removed only
# when no active batch reads them.

# KEYS: file, tenant's files, tenant's bytes, expiry index. ARGV: id, list score, bytes,
# expires_at or '', quota (-1: none), then the record's field, value pairs.
# Check-and-add in one step: {1, bytes used now} if registered, {0, bytes used} if over quota.
LUA_FILE_REGISTER = """
local old = tonumber(redis.call('HGET', KEYS[1], 'bytes')) or 0
local add = tonumber(ARGV[3]) - old
local used = tonumber(redis.call('GET', KEYS[3])) or 0
local quota = tonumber(ARGV[5])
if quota >= 0 and add > 0 and used + add > quota then return {0, used} end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1]) end
if add ~= 0 then redis.call('INCRBY', KEYS[3], add) end
return {1, used + add}
"""

# KEYS: file, tenant's files, tenant's bytes, expiry index, the file's readers.
# ARGV: tenant, id, batch key prefix, now, sweep (1: only if expired), retry_at, active statuses…
# {1, ''} deleted; {0, ''} not the tenant's file (or, for a DELETE, expired); {2, batch id}
# an active batch reads it (the sweep tries again at retry_at); {3, ''} not expired yet (the
# sweep's index is put back at the file's own expiry: another process's clock ran ahead).
LUA_FILE_REMOVE = """
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return {0, ''} end
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires_at') or '')
local expired = expires ~= nil and expires <= tonumber(ARGV[4])
if ARGV[5] == '1' and not expired then
  if expires then redis.call('ZADD', KEYS[4], 'XX', expires, ARGV[2]) else redis.call('ZREM', KEYS[4], ARGV[2]) end
  return {3, ''}
end
if ARGV[5] ~= '1' and expired then return {0, ''} end
local active = {}
for i = 7, #ARGV do active[ARGV[i]] = true end
for _, batch in ipairs(redis.call('SMEMBERS', KEYS[5])) do
  local status = redis.call('HGET', ARGV[3] .. batch, 'status')
  if status and active[status] then
    if ARGV[5] == '1' then redis.call('ZADD', KEYS[4], 'XX', ARGV[6], ARGV[2]) end
    return {2, batch}
  end
end
local size = tonumber(redis.call('HGET', KEYS[1], 'bytes')) or 0
redis.call('DEL', KEYS[1], KEYS[5])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
if redis.call('DECRBY', KEYS[3], size) <= 0 then redis.call('DEL', KEYS[3]) end
return {1, ''}
"""
