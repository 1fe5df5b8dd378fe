"""``overspill bulk``: run a JSONL file of OpenAI batch requests and write the output lines.

Two ways to reach overspill, one flow:

- ``--api-url``: through the HTTP API's ``/v1/files`` and ``/v1/batches`` (httpx); the API's
  batch driver moves the batch along.
- ``--redis-url``: straight to Redis with :class:`~producer.batches.BatchEngine`; this process
  drives its own batch (it holds the batch's lease while it steps it), so no API is needed.
  The file store directory must then be the one the API would use, if one runs: an API's
  driver may step the batch too, and the files it writes land in its own directory. A batch
  file missing here is reported as that (:class:`FileStoreMismatch`), naming the directory.

The batch id goes into a state file next to the output (``OUTPUT.state``) together with the
input's SHA-256, so running the same command again follows the same batch instead of
submitting a new one, whether the first run was stopped, crashed, or ran ``--no-wait``.
Once the batch is finished the output file gets every line, successes (the output file)
then failures (the error file), each in the OpenAI output-line format.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tqdm import tqdm

from ..client import Client
from ..errors import OverspillError
from .engine import BatchEngine
from .files import CHUNK_BYTES
from .lease import LeaseLost
from .lines import ENDPOINT_KINDS
from .state import ACTIVE, BatchSettings

POLL_S = 0.5


class BulkError(OverspillError):
    """The bulk run cannot go on; ``type`` says why (the CLI gives each type its exit code)."""

    type = "invalid_request"  # the input, OUTPUT or a local file


class Unreachable(BulkError):
    """Redis or the API did not answer."""

    type = "unreachable"


class ServerError(BulkError):
    """Redis or the API answered with an error of its own (a 5xx, a Redis error reply)."""

    type = "server_error"


class Refused(BulkError):
    """The API refused a request (a 4xx): the input file, the API key, the batch."""

    type = "api_error"


class FileStoreMismatch(BulkError):
    """A file of the batch is not in this process's file store: one with another store wrote it."""

    type = "file_store_mismatch"


class Backend(Protocol):
    async def upload(self, path: Path) -> str: ...
    async def create(self, file_id: str, endpoint: str) -> dict[str, Any]: ...
    async def poll(self, batch_id: str) -> dict[str, Any]: ...
    async def download(self, file_id: str, out: BinaryIO) -> None: ...
    async def aclose(self) -> None: ...


@dataclass
class BulkState:
    batch_id: str
    input_sha256: str
    target: str
    written: bool = False

    @staticmethod
    def path_for(output: Path) -> Path:
        return output.with_name(output.name + ".state")

    @classmethod
    def load(cls, output: Path) -> BulkState | None:
        try:
            return cls(**json.loads(cls.path_for(output).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self, output: Path) -> None:
        path = self.path_for(output)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)


# ---------------------------------------------------------------------------- backends


class ApiBackend:
    def __init__(self, api_url: str, api_key: str | None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=api_url.rstrip("/"), headers=headers, timeout=120.0)

    async def _json(self, response: httpx.Response) -> dict[str, Any]:
        where = f"{response.request.method} {response.request.url.path}"
        if response.status_code >= 400:
            await response.aread()
            error = ServerError if response.status_code >= 500 else Refused
            hint = (
                " (the API refused the key: --api-key or OVERSPILL_API_KEY)"
                if response.status_code == 401
                else ""
            )
            raise error(f"{where}: {response.status_code}{hint} {response.text[:500]}")
        try:
            data: dict[str, Any] = response.json()
        except ValueError:
            raise ServerError(f"{where}: the answer is not JSON (is this an overspill API?)") from None
        return data

    async def upload(self, path: Path) -> str:
        # The key first: an API refusing it answers 401 and closes the connection while a large
        # upload is still being sent, which reads as "cannot reach" (ReadError) rather than what
        # it is.
        await self._json(await self.http.get("/v1/batches", params={"limit": 1}))
        with open(path, "rb") as f:
            r = await self.http.post("/v1/files", data={"purpose": "batch"}, files={"file": (path.name, f)})
        return str((await self._json(r))["id"])

    async def create(self, file_id: str, endpoint: str) -> dict[str, Any]:
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        return await self._json(await self.http.post("/v1/batches", json=body))

    async def poll(self, batch_id: str) -> dict[str, Any]:
        return await self._json(await self.http.get(f"/v1/batches/{batch_id}"))

    async def download(self, file_id: str, out: BinaryIO) -> None:
        async with self.http.stream("GET", f"/v1/files/{file_id}/content") as r:
            if r.status_code >= 400:
                await self._json(r)
            async for chunk in r.aiter_bytes(CHUNK_BYTES):
                out.write(chunk)

    async def aclose(self) -> None:
        await self.http.aclose()


class RedisBackend:
    def __init__(self, settings: BatchSettings, tenant: str) -> None:
        self.client = Client(
            settings.redis_url,
            prefix=settings.prefix,
            pack_size=settings.batch_pack_size,
            chunk_size=settings.batch_pack_size,
            coalesce_window_ms=None,
        )
        self.engine = BatchEngine(settings, self.client)
        self.tenant = tenant

    async def upload(self, path: Path) -> str:
        record = await self.engine.files.save_upload(self.tenant, path.name, "batch", _file_chunks(path))
        return record.id

    async def create(self, file_id: str, endpoint: str) -> dict[str, Any]:
        return await self.engine.create(self.tenant, file_id, endpoint, "24h")

    async def poll(self, batch_id: str) -> dict[str, Any]:
        with self._in_store(), contextlib.suppress(LeaseLost):  # lost: another driver goes on with it
            await self.engine.step(batch_id)  # None when an API's driver holds it: it moves it along
        return await self.engine.get(self.tenant, batch_id)

    async def download(self, file_id: str, out: BinaryIO) -> None:
        await self.engine.files.get(self.tenant, file_id)
        with self._in_store():
            for chunk in self.engine.files.chunks(file_id):
                out.write(chunk)

    @contextlib.contextmanager
    def _in_store(self) -> Iterator[None]:
        """The batch's files exist (Redis says so): one missing here was written to another store."""
        try:
            yield
        except FileNotFoundError as exc:
            name = Path(exc.filename).name if exc.filename else "a file of the batch"
            raise FileStoreMismatch(
                f"{name} is not in the file store {self.engine.files.directory}: the batch was handled "
                "by a process using another one (an API's?); pass that directory with --files-dir "
                "(OVERSPILL_FILES_DIR), or go through the API with --api-url"
            ) from exc

    async def aclose(self) -> None:
        await self.client.aclose()


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            yield chunk


# ---------------------------------------------------------------------------- flow


def input_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def infer_endpoint(path: Path) -> str:
    """The url of the first request line (the batch's endpoint unless given)."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    url = json.loads(raw).get("url")
                except (ValueError, AttributeError):
                    break
                if url in ENDPOINT_KINDS:
                    return str(url)
                break
    raise BulkError(f"cannot tell the endpoint from the first line of {path}; pass --endpoint")


async def run_bulk(
    backend: Backend, target: str, input_path: Path, output: Path, endpoint: str | None, wait: bool
) -> dict[str, Any]:
    """Submit (or resume) the batch of ``input_path``; with ``wait``, follow it and write ``output``."""
    digest = input_digest(input_path)
    state = BulkState.load(output)
    if state is None or state.input_sha256 != digest or state.target != target:
        file_id = await backend.upload(input_path)
        batch = await backend.create(file_id, endpoint or infer_endpoint(input_path))
        state = BulkState(batch["id"], digest, target)
        state.save(output)
    if not wait:
        batch = await backend.poll(state.batch_id)
        return _summary(batch, None)
    batch = await follow(backend, state.batch_id)
    if not state.written or not output.exists():
        await write_output(backend, batch, output)
        state.written = True
        state.save(output)
    return _summary(batch, output)


async def follow(backend: Backend, batch_id: str) -> dict[str, Any]:
    """Poll until the batch is terminal, with a progress bar on stderr."""
    batch = await backend.poll(batch_id)
    bar = tqdm(total=batch["request_counts"]["total"] or None, unit="req", file=sys.stderr, mininterval=0.5)
    try:
        while batch["status"] in ACTIVE:
            _show(bar, batch)
            await asyncio.sleep(POLL_S)
            batch = await backend.poll(batch_id)
        _show(bar, batch)
    finally:
        bar.close()
    return batch


def _show(bar: tqdm, batch: dict[str, Any]) -> None:  # type: ignore[type-arg]
    counts = batch["request_counts"]
    if counts["total"] and bar.total != counts["total"]:
        bar.total = counts["total"]
    done = counts["completed"] + counts["failed"]
    if done > bar.n:
        bar.update(done - bar.n)
    postfix: dict[str, Any] = {
        "status": batch["status"],
        "done": counts["completed"],
        "failed": counts["failed"],
    }
    routes = (batch.get("overspill") or {}).get("routes")
    if routes:
        postfix.update({k: v for k, v in routes.items() if v})
    bar.set_postfix(postfix, refresh=False)


async def write_output(backend: Backend, batch: dict[str, Any], output: Path) -> None:
    """Output lines then error lines into ``output`` (whole, or not at all)."""
    part = output.with_name(output.name + ".part")
    try:
        with open(part, "wb") as out:
            for key in ("output_file_id", "error_file_id"):
                if batch.get(key):
                    await backend.download(batch[key], out)
    except BaseException:
        with contextlib.suppress(OSError):
            part.unlink()
        raise
    os.replace(part, output)


def _summary(batch: dict[str, Any], output: Path | None) -> dict[str, Any]:
    summary = {
        "batch_id": batch["id"],
        "status": batch["status"],
        "request_counts": batch["request_counts"],
        "output": str(output) if output else None,
    }
    if batch.get("errors"):
        summary["errors"] = batch["errors"]["data"][:10]
    return summary


def configure_cli_logging() -> None:
    """Logs to stderr, warnings and up: stdout carries the JSON summary only."""
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


async def bulk_main(
    input_path: Path,
    output: Path,
    endpoint: str | None,
    wait: bool,
    api_url: str | None,
    api_key: str | None,
    settings: BatchSettings,
    tenant: str,
) -> dict[str, Any]:
    target = api_url or f"{settings.redis_url}#{settings.prefix}"
    started = time.monotonic()
    backend: Backend | None = None
    try:
        backend = ApiBackend(api_url, api_key) if api_url else RedisBackend(settings, tenant)
        summary = await run_bulk(backend, target, input_path, output, endpoint, wait)
    except (RedisError, httpx.HTTPError, OSError) as exc:
        raise _bulk_error(exc, target) from exc
    finally:
        if backend is not None:
            with contextlib.suppress(Exception):
                await backend.aclose()
    if not api_url:
        summary["files_dir"] = str(settings.directory())
    summary["seconds"] = round(time.monotonic() - started, 2)
    return summary


def _bulk_error(exc: RedisError | httpx.HTTPError | OSError, target: str) -> BulkError:
    """Tell the server's side (unreachable, failing) from this machine's files."""
    where = _without_password(target)
    unreachable = (
        RedisConnectionError,
        RedisTimeoutError,
        httpx.TransportError,
        ConnectionError,
        TimeoutError,
    )
    if isinstance(exc, unreachable):  # the built-in two are OSErrors: tested before local files
        return Unreachable(f"cannot reach overspill at {where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, RedisError | httpx.HTTPError):
        return ServerError(f"overspill at {where} failed: {type(exc).__name__}: {exc}")
    # Any other OSError is local: the input, OUTPUT, its state file or the file store directory.
    return BulkError(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))


def _without_password(url: str) -> str:
    """``url`` for messages: a password in it is masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
