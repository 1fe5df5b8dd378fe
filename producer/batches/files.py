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

from pydantic import BaseModel

from ..contract import Keys, valid_id
from ..errors import ApiError, NotFound, PayloadTooLarge

CHUNK_BYTES = 1024 * 1024

Purpose = Literal["batch", "batch_output"]


class FileRecord(BaseModel):
    """A file's metadata, as stored in Redis."""

    id: str
    tenant: str
    bytes: int
    created_at: int
    filename: str
    purpose: Purpose
    status: Literal["uploaded", "processed", "error"] = "processed"

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
            "status_details": None,
        }


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


class FileStore:
    """Files of every tenant under one directory; a tenant sees only its own (404 otherwise)."""

    def __init__(self, redis: Any, keys: Keys, directory: Path, *, max_bytes: int) -> None:
        self.redis = redis
        self.keys = keys
        self.directory = directory
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, file_id: str) -> Path:
        return self.directory / f"{file_id}.jsonl"

    def part_path(self, file_id: str) -> Path:
        return self.directory / f".{file_id}.part"

    # ------------------------------------------------------------------ write

    async def save_upload(
        self, tenant: str, filename: str, purpose: Purpose, chunks: AsyncIterator[bytes]
    ) -> FileRecord:
        """Copy an upload chunk by chunk; 413 (and nothing kept) past ``max_bytes``."""
        file_id = new_file_id()
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
                    await asyncio.to_thread(out.write, chunk)
            if size == 0:
                raise ApiError("the file is empty", code="empty_file", param="file")
            os.replace(part, self.path(file_id))
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
        record = FileRecord(
            id=file_id,
            tenant=tenant,
            bytes=size,
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,
        )
        async with self.redis.pipeline(transaction=True) as pipe:
            self.register(pipe, record)
            await pipe.execute()
        return record

    def register(self, pipe: Any, record: FileRecord) -> None:
        """Queue the metadata writes of a complete file on ``pipe`` (a transaction)."""
        pipe.hset(self.keys.file(record.id), mapping=record.model_dump(mode="json"))
        pipe.zadd(self.keys.files(record.tenant), {record.id: record.created_at})

    def publish(self, file_id: str) -> int:
        """Rename a complete ``.part`` file to its final name; return its size."""
        part = self.part_path(file_id)
        size = part.stat().st_size
        os.replace(part, self.path(file_id))
        return size

    # ------------------------------------------------------------------ read

    async def get(self, tenant: str, file_id: str) -> FileRecord:
        raw = await self.redis.hgetall(self.keys.file(file_id)) if valid_id(file_id) else None
        if not raw or raw.get("tenant") != tenant:
            raise NotFound(f"No such File object: {file_id}", code="file_not_found", param="file_id")
        return FileRecord.model_validate(raw)

    def open(self, file_id: str) -> BinaryIO:
        return open(self.path(file_id), "rb")

    def chunks(self, file_id: str) -> Iterator[bytes]:
        with self.open(file_id) as f:
            while chunk := f.read(CHUNK_BYTES):
                yield chunk
