"""Files: listing, deleting, expiry and the per-tenant storage quota of ``/v1/files``.

Real parts only: the API is a process (``python -m producer.api``) on a prefix no worker
serves, so batches stay active for as long as a test needs; the official ``openai`` SDK
talks to it; the bytes are checked on disk and the records in the session's Redis.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis

from producer.contract import Keys
from tests.fixtures_api import TenantKeys
from tests.fixtures_batches import (
    BatchStack,
    embed_line,
    jsonl,
    start_batch_api,
    wait_batch,
    wait_for_submitted,
)

THIRTY_DAYS = 30 * 86400


@pytest.fixture(scope="module")
def store_stack(redis_url: str, run_dir: Path, tenants: TenantKeys) -> Iterator[BatchStack]:
    """An API with the default file settings, on a prefix no worker serves."""
    prefix = "t-files-" + secrets.token_hex(3)
    api = start_batch_api(run_dir, redis_url, prefix, tenants.path)
    yield BatchStack(api, prefix, None)
    api.stop()


@pytest.fixture(scope="module")
def quota_tenants(run_dir: Path) -> TenantKeys:
    """A tenant with room for 10 000 bytes of files, and one with the default quota."""
    keys = {name: "osk_" + secrets.token_urlsafe(24) for name in ("cramped", "roomy")}
    doc = {
        "tenants": [
            {"name": "cramped", "api_key_sha256": [_digest(keys["cramped"])], "max_file_bytes_total": 10_000},
            {"name": "roomy", "api_key_sha256": [_digest(keys["roomy"])]},
        ]
    }
    path = run_dir / "tenants-files.json"
    path.write_text(json.dumps(doc))
    return TenantKeys(path, keys, {})


@pytest.fixture(scope="module")
def short_stack(redis_url: str, run_dir: Path, quota_tenants: TenantKeys) -> Iterator[BatchStack]:
    """Expiries in seconds and a sweep every 0.2 s, so expiry can be watched."""
    prefix = "t-files-short-" + secrets.token_hex(3)
    api = start_batch_api(
        run_dir, redis_url, prefix, quota_tenants.path,
        OVERSPILL_FILE_EXPIRY_MIN_S="1", OVERSPILL_FILE_OUTPUT_EXPIRY_S="2", OVERSPILL_FILE_SWEEP_S="0.2",
    )  # fmt: skip
    yield BatchStack(api, prefix, None)
    api.stop()


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield r
    await r.aclose()


def _dir(stack: BatchStack) -> Path:
    assert stack.api.env is not None
    return Path(stack.api.env["OVERSPILL_FILES_DIR"])


async def create(sdk: openai.AsyncOpenAI, data: bytes, **kw: Any) -> Any:
    return await sdk.files.create(file=("in.jsonl", data), purpose="batch", **kw)


async def wait_gone(sdk: openai.AsyncOpenAI, file_id: str, timeout: float = 10.0) -> float:
    """Seconds until the file is a 404."""
    started = time.monotonic()
    while True:
        try:
            await sdk.files.retrieve(file_id)
        except openai.NotFoundError:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"{file_id} still there after {timeout}s"
        await asyncio.sleep(0.1)


async def cancelled_batch(sdk: openai.AsyncOpenAI, n: int = 5) -> Any:
    """A batch cancelled before anything ran: its error file holds every line."""
    file = await create(sdk, jsonl([embed_line(i) for i in range(n)]))
    batch = await sdk.batches.create(
        input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    await wait_for_submitted(sdk, batch.id, n)
    await sdk.batches.cancel(batch.id)
    return await wait_batch(sdk, batch.id, timeout=30)


# ---------------------------------------------------------------------------- list


async def test_files_list_pages_newest_first_and_filters_by_purpose(
    store_stack: BatchStack, tenants: TenantKeys
) -> None:
    async with store_stack.sdk(tenants, "wide") as sdk, store_stack.sdk(tenants, "globex") as other:
        done = await cancelled_batch(sdk)
        ids = [(await create(sdk, jsonl([embed_line(i)]))).id for i in range(5)]
        page = await sdk.files.list(limit=2)
        assert [f.id for f in page.data] == ids[::-1][:2]
        raw = json.loads((await sdk.files.with_raw_response.list(limit=2)).text)
        assert raw["object"] == "list" and raw["has_more"] is True
        assert (raw["first_id"], raw["last_id"]) == (ids[4], ids[3])
        everything = [f.id async for f in sdk.files.list(limit=2)]  # the SDK follows ``after``
        assert everything[:5] == ids[::-1] and len(everything) == len(set(everything))
        assert set(everything) == {*ids, done.input_file_id, done.error_file_id}
        assert [f.id for f in (await sdk.files.list()).data] == everything  # default limit: all
        assert [f.id for f in (await sdk.files.list(order="asc")).data] == everything[::-1]
        outputs = (await sdk.files.list(purpose="batch_output")).data
        assert [f.id for f in outputs] == [done.error_file_id]
        assert outputs[0].purpose == "batch_output"
        inputs = [f.id for f in (await sdk.files.list(purpose="batch", limit=3)).data]
        assert inputs == ids[::-1][:3]
        assert not (await other.files.list()).data  # another tenant's files are not listed
        for bad in (0, 10_001):
            with pytest.raises(openai.BadRequestError):
                await sdk.files.list(limit=bad)


# ---------------------------------------------------------------------------- delete


async def test_delete_removes_the_bytes_and_the_record(
    store_stack: BatchStack, tenants: TenantKeys, redis: aioredis.Redis
) -> None:
    async with store_stack.sdk(tenants, "acme") as sdk, store_stack.sdk(tenants, "globex") as other:
        file = await create(sdk, jsonl([embed_line(0)]))
        path = _dir(store_stack) / f"{file.id}.jsonl"
        assert path.exists()
        with pytest.raises(openai.NotFoundError):
            await other.files.delete(file.id)  # another tenant's id is unknown to them
        assert path.exists()
        deleted = await sdk.files.delete(file.id)
        assert (deleted.id, deleted.object, deleted.deleted) == (file.id, "file", True)
        assert not path.exists()
        assert not await redis.exists(Keys(store_stack.prefix).file(file.id))
        assert file.id not in [f.id for f in (await sdk.files.list()).data]
        for call in (sdk.files.retrieve, sdk.files.content, sdk.files.delete):
            with pytest.raises(openai.NotFoundError):
                await call(file.id)
        with pytest.raises(openai.NotFoundError):
            await sdk.files.delete("file-0123456789abcdef01234567")


async def test_deleting_an_active_batch_input_is_a_conflict(
    store_stack: BatchStack, tenants: TenantKeys
) -> None:
    """409 in the OpenAI shape while a batch still reads the file; the batch is unharmed."""
    async with store_stack.sdk(tenants, "acme") as sdk:
        file = await create(sdk, jsonl([embed_line(i) for i in range(20)]))
        batch = await sdk.batches.create(
            input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        with pytest.raises(openai.ConflictError) as conflict:
            await sdk.files.delete(file.id)
        error = conflict.value.body
        assert isinstance(error, dict) and error["code"] == "file_in_use" and batch.id in error["message"]
        assert conflict.value.response.headers["x-should-retry"] == "false"  # SDKs would retry a 409
        await wait_for_submitted(sdk, batch.id, 20)
        assert (await sdk.files.retrieve(file.id)).id == file.id
        await sdk.batches.cancel(batch.id)
        done = await wait_batch(sdk, batch.id, timeout=30)
        assert (
            done.status == "cancelled"
            and len((await sdk.files.content(done.error_file_id)).text.splitlines()) == 20
        )
        assert (await sdk.files.delete(file.id)).deleted  # nothing reads it any more


# ---------------------------------------------------------------------------- expiry


async def test_expires_after_is_validated_and_shown(store_stack: BatchStack, tenants: TenantKeys) -> None:
    """``expires_after`` as OpenAI takes it (created_at + 3600..2592000 s); outputs get 30 days."""
    async with store_stack.sdk(tenants, "acme") as sdk:
        file = await create(
            sdk, jsonl([embed_line(0)]), expires_after={"anchor": "created_at", "seconds": 3600}
        )
        assert file.expires_at == file.created_at + 3600
        assert (await sdk.files.retrieve(file.id)).expires_at == file.created_at + 3600
        assert (await create(sdk, jsonl([embed_line(0)]))).expires_at is None  # uploads: until deleted
        for bad in ({"anchor": "created_at", "seconds": 60}, {"anchor": "created_at", "seconds": THIRTY_DAYS + 1},
                    {"anchor": "last_active_at", "seconds": 3600}):  # fmt: skip
            with pytest.raises(openai.BadRequestError) as refused:
                await create(sdk, jsonl([embed_line(0)]), expires_after=bad)  # type: ignore[arg-type]
            assert str((refused.value.body or {})["param"]).startswith("expires_after")  # type: ignore[index]
        done = await cancelled_batch(sdk)
        error_file = await sdk.files.retrieve(done.error_file_id)
        assert error_file.expires_at == error_file.created_at + THIRTY_DAYS


async def test_the_sweep_deletes_expired_files_and_their_bytes(
    short_stack: BatchStack, quota_tenants: TenantKeys, redis: aioredis.Redis
) -> None:
    keys = Keys(short_stack.prefix)
    async with short_stack.sdk(quota_tenants, "roomy") as sdk:
        file = await create(sdk, jsonl([embed_line(0)]), expires_after={"anchor": "created_at", "seconds": 1})
        kept = await create(sdk, jsonl([embed_line(1)]))
        assert file.expires_at == file.created_at + 1
        assert await wait_gone(sdk, file.id) < 4
        await _until(lambda: not (_dir(short_stack) / f"{file.id}.jsonl").exists())
        assert not await redis.exists(keys.file(file.id))
        assert [f.id for f in (await sdk.files.list()).data] == [kept.id]
        done = await cancelled_batch(sdk)  # its error file expires 2 s after it is written
        assert done.error_file_id and done.input_file_id
        await wait_gone(sdk, done.error_file_id)
        await _until(lambda: not (_dir(short_stack) / f"{done.error_file_id}.jsonl").exists())
        assert (await sdk.files.retrieve(kept.id)).id == kept.id


async def test_the_sweep_survives_redis_errors(
    short_stack: BatchStack, quota_tenants: TenantKeys, redis: aioredis.Redis
) -> None:
    """The sweep's index replaced by a string (every tick fails), then repaired: it carries on."""
    index = Keys(short_stack.prefix).file_expiry()
    saved = await redis.zrange(index, 0, -1, withscores=True)
    await redis.delete(index)
    await redis.set(index, "not a sorted set")
    await asyncio.sleep(1.0)  # several ticks meet WRONGTYPE
    await redis.delete(index)
    if saved:
        await redis.zadd(index, dict(saved))
    async with short_stack.sdk(quota_tenants, "roomy") as sdk:
        file = await create(sdk, jsonl([embed_line(0)]), expires_after={"anchor": "created_at", "seconds": 1})
        assert await wait_gone(sdk, file.id) < 4
        await _until(lambda: not (_dir(short_stack) / f"{file.id}.jsonl").exists())
    assert "file sweep failed" in short_stack.api.log_path.read_text(errors="replace")


async def _until(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------- quota


async def test_the_storage_quota_holds_under_concurrent_uploads(
    short_stack: BatchStack, quota_tenants: TenantKeys
) -> None:
    """10 000 bytes: of five concurrent 6 000-byte uploads one passes; deleting or expiry frees room."""
    six_k, four_k = b"x" * 5999 + b"\n", b"y" * 3999 + b"\n"
    async with short_stack.sdk(quota_tenants, "cramped") as sdk:
        results = await asyncio.gather(*(create(sdk, six_k) for _ in range(5)), return_exceptions=True)
        passed = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(passed) == 1, results
        for err in refused:
            assert isinstance(err, openai.BadRequestError), err
            assert err.code == "storage_quota_exceeded" and "10000" in err.message
        on_disk = sorted(p.name for p in _dir(short_stack).iterdir())
        listed = sorted(f"{f.id}.jsonl" for f in await _all_files(short_stack, quota_tenants))
        assert on_disk == listed  # refused uploads left nothing behind
        small = await create(
            sdk, four_k, expires_after={"anchor": "created_at", "seconds": 1}
        )  # exactly full
        with pytest.raises(openai.BadRequestError):
            await create(sdk, b"\n")
        await sdk.files.delete(passed[0].id)
        await create(sdk, six_k)  # 4 000 + 6 000: full again
        await wait_gone(sdk, small.id)
        await _until(lambda: not (_dir(short_stack) / f"{small.id}.jsonl").exists())
        await create(sdk, four_k)  # the expired file's bytes were released
    async with short_stack.sdk(quota_tenants, "roomy") as roomy:
        await create(roomy, six_k)  # quotas are per tenant


async def _all_files(stack: BatchStack, tenants: TenantKeys) -> list[Any]:
    out = []
    for name in tenants.keys:
        async with stack.sdk(tenants, name) as sdk:
            out += (await sdk.files.list()).data
    return out
