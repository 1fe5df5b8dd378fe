"""Job records as Redis holds them: the arguments that write one, the envelope read back."""

from __future__ import annotations

from typing import Any

from ..contract import JobKind, JobResult, Status, WorkItem, dumps, loads, read_result
from ..errors import JobNotFound

# A queued record outlives its deadline by this much, so a late worker can still mark it expired.
RECORD_GRACE_S = 3600.0


def record_args(item: WorkItem, result_ttl_s: int, reply: str) -> list[Any]:
    """One job's LUA_SUBMIT arguments: its queued record and how long the record lives."""
    ttl = int(item.deadline_at - item.created_at + RECORD_GRACE_S + result_ttl_s)
    metadata = dumps(item.metadata) if item.metadata else ""
    stream = "1" if item.stream else "0"
    return [
        ttl,
        item.kind.value,
        item.tenant,
        item.lane.value,
        repr(item.created_at),
        metadata,
        reply,
        stream,
    ]


def envelope_from_reply(job_id: str, raw: str, tenant: str | None) -> JobResult:
    result = read_result(raw)
    if tenant is not None and result.tenant != tenant:
        raise JobNotFound(job_id)
    return result


def envelope_from_record(job_id: str, record: dict[str, str], tenant: str | None) -> JobResult:
    if not record or (tenant is not None and record.get("tenant") != tenant):
        raise JobNotFound(job_id)
    if "result" in record:
        # pydantic's own JSON parser: several times faster than json.loads on vectors.
        return read_result(record["result"])
    return JobResult(
        id=job_id,
        kind=JobKind(record["kind"]),
        status=Status(record["status"]),
        tenant=record.get("tenant", "default"),
        attempts=int(record.get("attempts", 0)),
        created_at=float(record["created_at"]),
        metadata=loads(record["metadata"]) if "metadata" in record else {},
    )
