"""Files for batches: the bytes in a directory, the metadata in Redis.

A file is what OpenAI's ``/v1/files`` calls one: an id (``file-…``), its tenant, size,
name, purpose (``batch`` for uploads, ``batch_output`` for what a batch writes) and status.
Its bytes live in ``<directory>/<id>.jsonl`` (``OVERSPILL_FILES_DIR``; by default ``files/``
under the run directory), its metadata in the Redis hash ``Keys.file(id)``. Several API
processes share one directory (a local disk, or a network mount); an object store would be
another implementation of the same few methods.

Nothing here holds a whole file in memory: uploads are copied in chunks, files are read
line by line or in chunks. A file appears under its final name only when it is complete
(written to a hidden ``.part`` file, then renamed), so a crash never leaves half a file
behind a valid id.

Storage is bounded: a file may expire (``expires_at``; batch outputs do by default), a
tenant's stored bytes are counted in ``Keys.file_bytes`` and checked against its quota in
the same script that registers a file, and a file is deleted (record and bytes) by
``DELETE /v1/files/{id}`` or, once expired, by the sweep (:mod:`producer.batches.sweep`). A
file that an active batch still reads is never deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal

import structlog
from pydantic import BaseModel
from redis.exceptions import WatchError

from ..contract import Keys, valid_id
from ..errors import ApiError, Conflict, NotFound, PayloadTooLarge
from .state import ACTIVE, LUA_FILE_REGISTER, LUA_FILE_REMOVE, PAGE, BatchSettings

log = structlog.get_logger("producer.batches")

CHUNK_BYTES = 1024 * 1024
MAX_EXPIRY_S = 30 * 86400  # OpenAI's upper bound for expires_after[seconds]

Purpose = Literal["batch", "batch_output"]
Removal = Literal["deleted", "gone", "in_use", "not_due"]
_REMOVALS: dict[int, Removal] = {0: "gone", 1: "deleted", 2: "in_use", 3: "not_due"}


class FileRecord(BaseModel):
    """A file's metadata, as stored in Redis."""

    id: str
    tenant: str
    bytes: int
    created_at: int
    filename: str
    purpose: Purpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def public(self) -> dict[str, Any]:
        """The OpenAI file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": self.status,
            "expires_at": self.expires_at,
            "status_details": None,
        }


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


class FileInUse(Conflict):
    """409: the file is the input of a batch that is still active."""

    def headers(self) -> dict[str, str]:
        return {"x-should-retry": "false"}  # OpenAI SDKs retry a 409 unless told not to


def quota_exceeded(quota: int, used: int, size: int | None, *, partial: bool = False) -> ApiError:
    """400, as OpenAI answers for storage limits: SDKs raise BadRequestError and do not retry."""
    needs = "" if size is None else f" and this file needs {'at least ' if partial else ''}{size}"
    return ApiError(
        f"File storage quota exceeded: {used} of {quota} bytes are in use{needs}. "
        "Delete files (DELETE /v1/files/{file_id}) or let them expire.",
        code="storage_quota_exceeded",
        param="file",
    )


def not_found(file_id: str) -> NotFound:
    return NotFound(f"No such File object: {file_id}", code="file_not_found", param="file_id")


class FileStore:
    """Files of every tenant under one directory; a tenant sees only its own (404 otherwise)."""

    def __init__(
        self, redis: Any, keys: Keys, directory: Path, *, max_bytes: int, output_expiry_s: int = 0
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.directory = directory
        self.max_bytes = max_bytes
        self.output_expiry_s = output_expiry_s  # 0: outputs are kept until deleted
        self._register = redis.register_script(LUA_FILE_REGISTER)
        self._remove = redis.register_script(LUA_FILE_REMOVE)
        directory.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_settings(cls, redis: Any, keys: Keys, settings: BatchSettings) -> FileStore:
        return cls(
            redis,
            keys,
            settings.directory(),
            max_bytes=settings.max_file_bytes,
            output_expiry_s=settings.file_output_expiry_s,
        )

    def path(self, file_id: str) -> Path:
        return self.directory / f"{file_id}.jsonl"

    def part_path(self, file_id: str) -> Path:
        return self.directory / f".{file_id}.part"

    # ------------------------------------------------------------------ write

    async def save_upload(
        self,
        tenant: str,
        filename: str,
        purpose: Purpose,
        chunks: AsyncIterator[bytes],
        *,
        quota: int | None = None,
        expires_after_s: int | None = None,
    ) -> FileRecord:
        """Copy an upload chunk by chunk; 413 past ``max_bytes``, 400 past the tenant's ``quota``.

        The quota is checked for good when the file is registered, in one script with the
        count, so concurrent uploads cannot together pass it; the copy stops early once the
        file cannot fit the room there was when it started. Nothing is kept when refused.
        """
        file_id = new_file_id()
        used = await self.used(tenant) if quota is not None else 0
        if quota is not None and used >= quota:
            raise quota_exceeded(quota, used, None)
        size = await self._copy(file_id, chunks, None if quota is None else (quota, used))
        now = int(time.time())
        record = FileRecord(
            id=file_id,
            tenant=tenant,
            bytes=size,
            created_at=now,
            filename=filename,
            purpose=purpose,
            expires_at=None if expires_after_s is None else now + expires_after_s,
        )
        fits, used = await self._register(
            keys=self._record_keys(record), args=self._record_args(record, -1 if quota is None else quota)
        )
        if not int(fits):
            self.unlink(file_id)
            raise quota_exceeded(int(quota or 0), int(used), size)
        return record

    async def _copy(self, file_id: str, chunks: AsyncIterator[bytes], room: tuple[int, int] | None) -> int:
        """Write the upload under its final name; ``room`` is (quota, bytes used), or None."""
        part = self.part_path(file_id)
        size = 0
        try:
            with open(part, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise PayloadTooLarge(
                            f"file exceeds {self.max_bytes} bytes", code="file_too_large", param="file"
                        )
                    if room is not None and room[1] + size > room[0]:
                        raise quota_exceeded(room[0], room[1], size, partial=True)
                    await asyncio.to_thread(out.write, chunk)
            if size == 0:
                raise ApiError("the file is empty", code="empty_file", param="file")
            os.replace(part, self.path(file_id))
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
        return size

    def register(self, pipe: Any, record: FileRecord) -> None:
        """Queue the metadata of a complete file on ``pipe`` (a transaction); never refused.

        Batch outputs get the default expiry. Registering a file again (a finalisation redone
        after a crash) counts only the difference in size.
        """
        if record.expires_at is None and record.purpose == "batch_output" and self.output_expiry_s:
            record = record.model_copy(update={"expires_at": record.created_at + self.output_expiry_s})
        keys = self._record_keys(record)
        pipe.eval(LUA_FILE_REGISTER, len(keys), *keys, *self._record_args(record, -1))

    def _record_keys(self, record: FileRecord) -> list[str]:
        k = self.keys
        return [k.file(record.id), k.files(record.tenant), k.file_bytes(record.tenant), k.file_expiry()]

    def _record_args(self, record: FileRecord, quota: int) -> list[Any]:
        fields = [x for pair in record.model_dump(mode="json", exclude_none=True).items() for x in pair]
        expires = "" if record.expires_at is None else record.expires_at
        # The list's score is the precise time, so files uploaded within a second keep their order.
        return [record.id, repr(time.time()), record.bytes, expires, quota, *fields]

    def publish(self, file_id: str) -> int:
        """Rename a complete ``.part`` file to its final name; return its size."""
        part = self.part_path(file_id)
        size = part.stat().st_size
        os.replace(part, self.path(file_id))
        return size

    @contextlib.asynccontextmanager
    async def claim(self, tenant: str, file_id: str, reader: str) -> AsyncIterator[tuple[FileRecord, Any]]:
        """The file, and a transaction (run on exit) that records batch ``reader`` as reading it.

        The file's record is WATCHed: if a DELETE or the sweep removes it before the commit,
        the batch is not created (404, as for an unknown file) rather than left without input.
        """
        if not valid_id(file_id):
            raise not_found(file_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            await pipe.watch(self.keys.file(file_id))
            record = await self.get(tenant, file_id)
            pipe.multi()
            pipe.sadd(self.keys.file_readers(file_id), reader)
            yield record, pipe
            try:
                await pipe.execute()
            except WatchError:
                raise not_found(file_id) from None

    # ------------------------------------------------------------------ delete

    async def delete(self, tenant: str, file_id: str) -> None:
        """Delete a file (record, then bytes); 404 if not the tenant's, 409 while a batch reads it."""
        if not valid_id(file_id):
            raise not_found(file_id)
        outcome, batch_id = await self._removal(tenant, file_id, sweep=False, retry_at=0)
        if outcome == "in_use":
            raise FileInUse(
                f"File {file_id} is the input of batch {batch_id}, which is still active: cancel the "
                "batch or wait for it to end, then delete the file.",
                code="file_in_use",
                param="file_id",
            )
        if outcome != "deleted":
            raise not_found(file_id)
        self.unlink(file_id)

    async def expire(self, file_id: str, retry_at: float) -> Removal:
        """Delete a file whose time has come; one an active batch reads is tried again at ``retry_at``."""
        tenant = await self.redis.hget(self.keys.file(file_id), "tenant")
        if tenant is None:  # deleted meanwhile, or its bytes outlived a crash: drop both
            await self.redis.zrem(self.keys.file_expiry(), file_id)
            self.unlink(file_id)
            return "gone"
        outcome, _ = await self._removal(str(tenant), file_id, sweep=True, retry_at=retry_at)
        if outcome == "deleted":
            self.unlink(file_id)
        return outcome

    async def due(self, limit: int) -> list[str]:
        """Ids of files whose expiry has come, earliest first, at most ``limit``."""
        ids = await self.redis.zrangebyscore(self.keys.file_expiry(), "-inf", time.time(), start=0, num=limit)
        return [str(i) for i in ids]

    async def _removal(
        self, tenant: str, file_id: str, *, sweep: bool, retry_at: float
    ) -> tuple[Removal, str]:
        k = self.keys
        keys = [
            k.file(file_id),
            k.files(tenant),
            k.file_bytes(tenant),
            k.file_expiry(),
            k.file_readers(file_id),
        ]
        args = [
            tenant,
            file_id,
            k.batch(""),
            repr(time.time()),
            int(sweep),
            repr(retry_at),
            *(s.value for s in ACTIVE),
        ]
        code, detail = await self._remove(keys=keys, args=args)
        return _REMOVALS[int(code)], str(detail)

    def unlink(self, file_id: str) -> None:
        """Remove a file's bytes; a failure leaves them behind (logged), never its record."""
        try:
            self.path(file_id).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("file bytes not removed", file_id=file_id, error=str(exc)[:200])

    # ------------------------------------------------------------------ read

    async def get(self, tenant: str, file_id: str) -> FileRecord:
        """The tenant's file; 404 if unknown, another tenant's, or expired."""
        raw = await self.redis.hgetall(self.keys.file(file_id)) if valid_id(file_id) else None
        if not raw or raw.get("tenant") != tenant:
            raise not_found(file_id)
        record = FileRecord.model_validate(raw)
        if record.expired(time.time()):
            raise not_found(file_id)
        return record

    async def used(self, tenant: str) -> int:
        """Bytes of the tenant's stored files."""
        return int(await self.redis.get(self.keys.file_bytes(tenant)) or 0)

    async def list(
        self,
        tenant: str,
        limit: int,
        after: str | None = None,
        purpose: str | None = None,
        newest_first: bool = True,
    ) -> dict[str, Any]:
        """A page of the tenant's files (OpenAI's list object); ``after`` is the previous page's last id."""
        key = self.keys.files(tenant)
        start = 0
        if after:
            rank = await (self.redis.zrevrank if newest_first else self.redis.zrank)(key, after)
            if rank is None:  # a cursor that is gone ends the listing rather than restarting it
                return _page([], has_more=False)
            start = int(rank) + 1
        found: list[FileRecord] = []
        now = time.time()
        while len(found) <= limit:
            read = self.redis.zrevrange if newest_first else self.redis.zrange
            ids: list[str] = await read(key, start, start + PAGE - 1)
            if not ids:
                break
            start += len(ids)
            for record in await self._records(ids):
                if not record.expired(now) and purpose in (None, record.purpose):
                    found.append(record)
        return _page([r.public() for r in found[:limit]], has_more=len(found) > limit)

    async def _records(self, ids: list[str]) -> list[FileRecord]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for file_id in ids:
                pipe.hgetall(self.keys.file(file_id))
            raws = await pipe.execute()
        return [FileRecord.model_validate(raw) for raw in raws if raw]

    def open(self, file_id: str) -> BinaryIO:
        return open(self.path(file_id), "rb")

    def chunks(self, file_id: str) -> Iterator[bytes]:
        with self.open(file_id) as f:
            while chunk := f.read(CHUNK_BYTES):
                yield chunk


def _page(data: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
