"""Serialisation on the wire (JSON records, msgpack arq jobs; never pickle) and package queueing."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import msgpack
from arq.constants import job_key_prefix
from arq.jobs import serialize_job

from .chunks import chunk_of, chunk_payload
from .fairness import line_up, next_order
from .keys import Keys
from .kinds import Lane
from .options import WorkItem

TASK_NAME = "run_items"  # the arq function every work package calls


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def loads(data: str | bytes) -> Any:
    return json.loads(data)


def pack_job(obj: Any) -> bytes:
    """arq ``job_serializer``: msgpack, so no pickle ever crosses Redis."""
    return msgpack.packb(obj, use_bin_type=True)


class Package(dict[str, Any]):
    """An arq job's payload (a work package, a webhook delivery) as a worker gets it: a plain
    map, with a short ``repr``.

    arq formats ``repr`` of every job's arguments for its start log line, whatever the log
    level; for a package that is all its items' inputs (a cost per job, and job contents in a
    log line). This repr names the size only.
    """

    def __repr__(self) -> str:
        items = self.get("items", self.get("entries"))
        return (
            f"<package: {len(items)} items>" if isinstance(items, list) else f"<payload: {len(self)} fields>"
        )


def unpack_job(data: bytes) -> Any:
    """arq ``job_deserializer``; a package's payload comes back as a :class:`Package`."""
    job = msgpack.unpackb(data, raw=False, strict_map_key=False)
    args = job.get("a") if isinstance(job, dict) else None
    if isinstance(args, list) and args and type(args[0]) is dict:
        args[0] = Package(args[0])
    return job


def wake_channel(queue: str) -> str:
    """The pub/sub channel that tells a queue's workers a package was queued (poll now)."""
    return f"{queue}:wake"


# arq drops a job not started within its expiry without running it: keep that past every deadline.
ARQ_EXPIRY_GRACE_MS = 24 * 3600 * 1000


def add_package(
    pipe: Any,
    keys: Keys,
    items: list[WorkItem],
    lane: Lane | str,
    *,
    job_try: int | None = None,
    defer_s: float = 0.0,
    retries: int = 0,
    crashes: int = 0,
    order_us: int | None = None,
) -> str:
    """Queue one work package (an arq job carrying ``items``) on a Redis pipeline.

    Jobs of a bulk chunk (all of one chunk) travel in the chunk's compact form. A package holds
    one tenant's jobs; ``order_us`` keeps a re-queued package's place in its tenant's line.
    """
    if chunk_of(items[0].id) is not None:
        payload = chunk_payload(items)
    else:
        payload = {"items": [i.model_dump(mode="json", exclude_none=True) for i in items]}
    latest = max(i.deadline_at for i in items)
    return queue_payload(
        pipe,
        keys,
        payload,
        lane,
        latest,
        tenant=items[0].tenant,
        items=len(items),
        job_try=job_try,
        defer_s=defer_s,
        retries=retries,
        crashes=crashes,
        order_us=order_us,
    )


def queue_payload(
    pipe: Any,
    keys: Keys,
    payload: dict[str, Any],
    lane: Lane | str,
    deadline_at: float,
    *,
    tenant: str,
    items: int,
    job_try: int | None = None,
    defer_s: float = 0.0,
    retries: int = 0,
    crashes: int = 0,
    order_us: int | None = None,
) -> str:
    """Queue a package's payload (``items``, or a chunk's ``chunk`` and ``entries``).

    Written in arq's own job format with our msgpack serializer, so packages can be queued
    in the same pipeline as the item records they belong to; lined up in its tenant's line
    of the lane (``contract/fairness.py``), which decides when a worker claims it.
    """
    package_id = "pkg_" + secrets.token_hex(12)
    run_at_ms = int((time.time() + defer_s) * 1000)
    order_us = order_us if order_us is not None else next_order()
    # retries: times these items found no backend; crashes: runs that died or timed out;
    # order: its place in its tenant's line, kept when it is queued again.
    payload = {**payload, "retries": retries, "crashes": crashes, "order": order_us}
    data = serialize_job(TASK_NAME, (payload,), {}, job_try, run_at_ms, serializer=pack_job)
    expiry_ms = max(int((deadline_at - time.time()) * 1000), 0) + ARQ_EXPIRY_GRACE_MS
    pipe.psetex(job_key_prefix + package_id, expiry_ms, data)
    queue = keys.queue(lane)
    pipe.zadd(queue, {package_id: run_at_ms})
    line_up(pipe, keys, lane, package_id, tenant=tenant, items=items, order_us=order_us, run_at_ms=run_at_ms)
    if not defer_s:
        pipe.publish(wake_channel(queue), "")
    return package_id
