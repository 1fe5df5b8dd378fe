"""Reading results in bulk: one script call per pass returns the finished jobs' envelopes."""

from __future__ import annotations

import asyncio

import pytest

from producer import Client, JobNotFound
from producer.client import reading as client_module

from .test_recovery import FIXED


async def test_wait_many_returns_every_envelope_in_order_past_the_byte_budget(
    session_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a budget of one envelope per call, the rest are read whole: the same results."""
    ids = await session_client.submit_many([("embed", {"model": FIXED, "input": f"r{i}"}) for i in range(50)])
    full = await session_client.wait_many(ids, timeout=60)
    monkeypatch.setattr(client_module, "COLLECT_BYTES", 1)
    monkeypatch.setattr(client_module, "COLLECT_KEYS", 7)  # several calls per pass
    again = await session_client.wait_many(ids, timeout=60)
    assert [r.id for r in again] == ids
    assert [r.model_dump() for r in again] == [r.model_dump() for r in full]
    assert {r.status.value for r in again} == {"succeeded"}


async def test_a_bulk_reader_never_sees_another_tenants_job(session_client: Client) -> None:
    theirs = await session_client.submit("embed", {"model": FIXED, "input": "x"}, tenant="acme")
    await session_client.wait(theirs, timeout=60, tenant="acme")
    with pytest.raises(JobNotFound):
        await session_client.wait_many([theirs], timeout=5, tenant="globex")
    with pytest.raises(JobNotFound):
        await session_client.wait_many(["job_" + "0" * 24], timeout=5)


async def _submitted(client: Client, n: int, tag: str) -> list[str]:
    return list(
        await asyncio.gather(
            *(client.submit("embed", {"model": FIXED, "input": f"{tag}{i}"}) for i in range(n))
        )
    )


def _count_collected(client: Client, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Keys the client's polling script is asked about, call by call."""
    calls: list[int] = []
    collect = client._collect

    async def counted(*, keys: list[str], args: list[object]) -> object:
        calls.append(len(keys))
        return await collect(keys=keys, args=args)

    monkeypatch.setattr(client, "_collect", counted)
    return calls


async def test_jobs_submitted_here_are_read_as_their_replies_arrive_not_polled(
    session_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "RECHECK_S", 30.0)  # no record re-read in this test
    client = session_client
    polled = _count_collected(client, monkeypatch)
    ids = await _submitted(client, 200, "live")
    results = await client.wait_many(ids, timeout=60)
    assert [r.id for r in results] == ids
    assert {r.status.value for r in results} == {"succeeded"}
    assert all(len(r.body["data"][0]["embedding"]) == 384 for r in results if r.body)
    assert polled == []  # no pass looked at pending jobs


async def test_a_reply_that_never_comes_costs_only_a_record_read(
    session_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "RECHECK_S", 0.2)
    client = session_client
    polled = _count_collected(client, monkeypatch)
    await client._replies.aclose()

    async def never_reads() -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(client._replies, "_read", never_reads)  # every reply is left unread
    ids = await _submitted(client, 20, "lost")
    results = await client.wait_many(ids, timeout=60)
    assert [r.id for r in results] == ids
    assert {r.status.value for r in results} == {"succeeded"}
    assert polled and polled[0] == len(ids)  # the records were read, all at once
