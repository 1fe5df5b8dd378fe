"""Reading results in bulk: one script call per pass returns the finished jobs' envelopes."""

from __future__ import annotations

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
