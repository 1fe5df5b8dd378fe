"""Every Redis key the system uses, under one versioned prefix; job ids and fingerprints."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from .chunks import chunk_of
from .kinds import JobKind, Lane

KEY_VERSION = "v1"  # part of every key: a new layout gets a new version
ACTIVITY_BUCKET_S = 10  # the time slice of ``Keys.activity``
ACTIVITY_KEEP_S = 3600  # how long a slice is kept


class Keys:
    """Every Redis key the system uses, under one versioned prefix.

    Several deployments can share a Redis by choosing different prefixes.
    """

    def __init__(self, prefix: str = "overspill") -> None:
        self.root = f"{prefix}:{KEY_VERSION}"

    def job(self, job_id: str) -> str:
        """Hash: status, kind, tenant, created_at, attempts, result (JSON envelope)."""
        return f"{self.root}:job:{job_id}"

    def chunk(self, chunk_id: str) -> str:
        """Hash: the jobs of one bulk chunk, their attempts and results (``contract/chunks.py``)."""
        return f"{self.root}:chunk:{chunk_id}"

    def record(self, job_id: str) -> str:
        """The hash that holds the job: its own record, or its chunk's."""
        located = chunk_of(job_id)
        return self.job(job_id) if located is None else self.chunk(located[0])

    def done(self, job_id: str) -> str:
        """List that receives one element when the job is terminal (long-poll target)."""
        return f"{self.root}:done:{job_id}"

    def reply(self, client_id: str) -> str:
        """List: terminal envelopes of one client's jobs, pushed for its waiters."""
        return f"{self.root}:reply:{client_id}"

    def queue(self, lane: Lane | str) -> str:
        """The arq queue (sorted set) of a lane."""
        return f"{self.root}:queue:{Lane(lane).value}"

    def fair(self, lane: Lane | str) -> str:
        """Prefix of a lane's fair-share keys: each tenant's line, the tenants in turn, leases
        (``contract/fairness.py``)."""
        return f"{self.root}:fair:{Lane(lane).value}:"

    def shares(self) -> str:
        """Hash: tenant → ``share|cap`` from the tenants file, for the fair-share claim."""
        return f"{self.root}:shares"

    def idempotency(self, tenant: str, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return f"{self.root}:idem:{tenant}:{digest}"

    def cache(self, fingerprint: str) -> str:
        return f"{self.root}:cache:{fingerprint}"

    def stats(self) -> str:
        """Hash of counters the workers publish (batches, items) for reports."""
        return f"{self.root}:stats"

    def usage(self, day: str) -> str:
        """Hash: the usage ledger of one UTC day (``YYYY-MM-DD``), see ``contract/usage.py``."""
        return f"{self.root}:usage:{day}"

    def remote_spend(self, month: str) -> str:
        """Hash: tenant → dollars spent on remotes in one UTC month (``YYYY-MM``), for budgets."""
        return f"{self.root}:spend:{month}"

    def policy(self) -> str:
        """String: the live routing policy (YAML or JSON), wins over the workers' policy file."""
        return f"{self.root}:policy"

    def policy_effective(self) -> str:
        """Hash: worker id → JSON ``{policy, source, at}``, the policy each worker applies."""
        return f"{self.root}:policy:effective"

    def models(self) -> str:
        """Hash: model id → JSON :class:`~producer.contract.ModelCard`, written by the workers."""
        return f"{self.root}:models"

    def readiness(self) -> str:
        """Hash: worker id → JSON ``{triton_ready, until}``, each worker's latest Triton probe,
        current until ``until`` (epoch seconds); the API's ``/readyz`` reads it."""
        return f"{self.root}:readiness"

    def worker_status(self) -> str:
        """Hash: worker id → JSON status report (lanes, gates, breakers, replicas, providers),
        rewritten every second and current until its ``until``; the console's overview reads it."""
        return f"{self.root}:workers:status"

    def activity(self, bucket: int) -> str:
        """Hash: jobs finished per route and items picked up per lane in one ``ACTIVITY_BUCKET_S``
        slice of time (``bucket`` = epoch seconds // ``ACTIVITY_BUCKET_S``), summed over workers."""
        return f"{self.root}:activity:{bucket}"

    def webhooks(self) -> str:
        """The arq queue (sorted set) of webhook deliveries that producers from before the
        outbox queued; a worker moves what it finds there into the outbox."""
        return f"{self.root}:queue:webhooks"

    def outbox(self) -> str:
        """Prefix of the webhook outbox (producer/contract/deliveries.py): ``<prefix>t:<tenant>``
        (sorted set: webhook_id → when it is due, or its lease's end once claimed),
        ``<prefix>tenants`` (sorted set: tenant → its line's earliest score) and ``<prefix>data``
        (hash: webhook_id → :class:`Delivery` JSON)."""
        return f"{self.root}:outbox:"

    def webhook(self, job_id: str) -> str:
        """Hash: a job's webhook delivery state (see :class:`DeliveryState`)."""
        return f"{self.root}:webhook:{job_id}"

    def dead_letters(self, tenant: str) -> str:
        """Hash: webhook_id → :class:`DeadLetter` JSON, per tenant."""
        return f"{self.root}:webhooks:dead:{tenant}"

    def dead_letter_order(self, tenant: str) -> str:
        """Sorted set: webhook_id → failed_at of a tenant's dead letters, to drop the oldest."""
        return f"{self.root}:webhooks:deadorder:{tenant}"

    def disabled_endpoints(self) -> str:
        """Hash: webhook URL → why it was disabled (it answered 410 Gone)."""
        return f"{self.root}:webhooks:disabled"

    def rate(self, tenant: str) -> str:
        """Hash: a tenant's request token bucket (tokens, ts)."""
        return f"{self.root}:rate:{tenant}"

    def stream(self, job_id: str) -> str:
        """Stream: a streamed job's events (status, token deltas), see ``contract/streams.py``."""
        return f"{self.root}:stream:{job_id}"

    def stream_cancel(self, job_id: str) -> str:
        """String: set when a running job is to stop (cancelled, or its stream's reader went away)."""
        return f"{self.root}:stream-cancel:{job_id}"

    def cancel_epoch(self) -> str:
        """Integer: raised by every cancel request, so workers look for cancelled jobs they hold
        that no watch covers (inputs waiting in a batcher) only when there may be one."""
        return f"{self.root}:cancel-epoch"

    def open_streams(self, tenant: str) -> str:
        """Sorted set: a tenant's SSE responses open now, scored by when each lapses."""
        return f"{self.root}:streams:{tenant}"

    def open_jobs(self, tenant: str) -> str:
        """Sorted set: a tenant's jobs not yet known to be terminal (for its queued-jobs limit)."""
        return f"{self.root}:open:{tenant}"

    # Batches (producer/batches.py): uploaded files and OpenAI-style batches over them.

    def file(self, file_id: str) -> str:
        """Hash: an uploaded or generated file's metadata (its bytes live in the file store)."""
        return f"{self.root}:file:{file_id}"

    def files(self, tenant: str) -> str:
        """Sorted set: a tenant's file ids by creation time."""
        return f"{self.root}:files:{tenant}"

    def file_readers(self, file_id: str) -> str:
        """Set: the batches created on a file (an active one among them blocks its deletion)."""
        return f"{self.root}:file:{file_id}:batches"

    def file_bytes(self, tenant: str) -> str:
        """String: the bytes of a tenant's stored files, counted against its quota."""
        return f"{self.root}:filebytes:{tenant}"

    def file_expiry(self) -> str:
        """Sorted set: file ids by when they expire, for the sweep."""
        return f"{self.root}:file-expiry"  # not under files:, where tenant names go

    def batch(self, batch_id: str) -> str:
        """Hash: a batch's state (status, timestamps, counts, submission progress)."""
        return f"{self.root}:batch:{batch_id}"

    def batch_lines(self, batch_id: str) -> str:
        """List: one JSON entry per request line, in input order: [custom_id, job_id, error]."""
        return f"{self.root}:batch:{batch_id}:lines"

    def batch_lease(self, batch_id: str) -> str:
        """String: which driver works on the batch now (expires if that driver dies)."""
        return f"{self.root}:batch:{batch_id}:lease"

    def batches(self, tenant: str) -> str:
        """Sorted set: a tenant's batch ids by creation time."""
        return f"{self.root}:batches:{tenant}"

    def active_batches(self) -> str:
        """Set: batches not yet in a terminal state, for the drivers to resume."""
        return f"{self.root}:batches:active"


# What an id from outside may look like before it becomes part of a key: no ':' (the key
# separator) and no glob characters, so an id can never name another record's key.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


def valid_id(value: str) -> bool:
    """May ``value`` (a job, batch or file id from a request) be looked up at all?"""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def redis_url_with_secret(url: str) -> str:
    """``url`` with the password from the file ``OVERSPILL_REDIS_PASSWORD_FILE`` names, if set.

    A mounted secret keeps the password out of the environment (and of ``ps``); a URL that
    carries a password of its own keeps it.
    """
    path = os.environ.get("OVERSPILL_REDIS_PASSWORD_FILE")
    if not path:
        return url
    parts = urlsplit(url)
    if parts.password:
        return url
    password = quote(Path(path).read_text(encoding="utf-8").strip(), safe="")
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{user}:{password}@{host}", parts.path, parts.query, parts.fragment))


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def request_fingerprint(kind: JobKind | str, body: dict[str, Any]) -> str:
    canonical = json.dumps({"kind": str(kind), "body": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
