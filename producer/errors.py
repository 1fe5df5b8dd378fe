"""Errors raised by the producer side.

OverspillError
├── JobNotFound      unknown id, expired record, or another tenant's job
├── JobTimeout       wait() ran out of time before the job was terminal
└── (InvalidBody, LimitExceeded live in the contract: producer.jobs)
"""

from __future__ import annotations


class OverspillError(Exception):
    """Root of the producer's errors."""


class JobNotFound(OverspillError, KeyError):
    def __str__(self) -> str:
        return f"job {self.args[0]!r} not found"


class JobTimeout(OverspillError, TimeoutError):
    pass
