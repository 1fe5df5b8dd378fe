"""Errors raised by the producer side.

OverspillError
├── JobNotFound        unknown id, expired record, or another tenant's job
├── JobTimeout         wait() ran out of time before the job was terminal
├── ApiError           an HTTP API answer other than success (status, type, code)
│   ├── Unauthorized       401: no or unknown API key
│   ├── Forbidden          403: e.g. another tenant's usage without an admin key
│   ├── NotFound           404
│   ├── Conflict           409: e.g. cancelling a running job
│   ├── PayloadTooLarge    413
│   ├── RateLimited        429, with ``retry_after_s``
│   ├── JobFailed          502: a synchronous call's job failed for a reason not the caller's
│   └── GatewayTimeout     504: a synchronous call's job did not finish in time
└── (InvalidBody, LimitExceeded live in the contract: producer.contract)
"""

from __future__ import annotations


class OverspillError(Exception):
    """Root of the producer's errors."""


class JobNotFound(OverspillError, KeyError):
    def __str__(self) -> str:
        return f"job {self.args[0]!r} not found"


class JobTimeout(OverspillError, TimeoutError):
    pass


class ApiError(OverspillError):
    """An error answer in the OpenAI shape ``{error: {message, type, param, code}}``."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param

    def headers(self) -> dict[str, str]:
        return {}

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class Unauthorized(ApiError):
    status = 401
    type = "authentication_error"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(ApiError):
    status = 403
    type = "permission_error"


class NotFound(ApiError):
    status = 404
    type = "not_found_error"


class Conflict(ApiError):
    status = 409
    type = "conflict_error"


class PayloadTooLarge(ApiError):
    status = 413
    type = "invalid_request_error"


class RateLimited(ApiError):
    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float, code: str = "rate_limit_exceeded") -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, int(-(-self.retry_after_s // 1))))}


class JobFailed(ApiError):
    status = 502
    type = "api_error"


class GatewayTimeout(ApiError):
    status = 504
    type = "timeout_error"
