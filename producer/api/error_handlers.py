"""Exception handlers: every error the API returns, 4xx or 5xx, in the OpenAI error shape.

``{error: {message, type, param, code}}``: bad input of any kind is a 4xx; a 5xx means
overspill itself (or its Redis) failed, and never carries a traceback.
"""

from __future__ import annotations

import json

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ..contract import MAX_DEPTH, InvalidBody, JobResult, Status
from ..errors import (
    ApiError,
    Conflict,
    Forbidden,
    GatewayTimeout,
    JobFailed,
    JobNotFound,
    NotFound,
    OverspillError,
)

log = structlog.get_logger("producer.api")


class ErrorResponse(JSONResponse):
    """A JSON error body with every non-ASCII character escaped: an error may quote the input,
    and input can hold what UTF-8 cannot encode (a lone surrogate), which must not turn a 400
    into a 500."""

    def render(self, content: object) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


_CLIENT_FAULTS: dict[str, type[ApiError]] = {
    "invalid_request": ApiError,
    "limit_exceeded": ApiError,
    "model_error": ApiError,
    "model_not_found": NotFound,
    "cancelled": Conflict,
    "budget_exceeded": Forbidden,  # the tenant's monthly remote budget is spent
}


def job_error(result: JobResult) -> ApiError:
    """The HTTP error of a synchronous call whose job did not succeed."""
    kind = result.error.type if result.error else result.status.value
    message = result.error.message if result.error else f"job {result.status.value}"
    if kind == "deadline_exceeded" or result.status == Status.expired:
        return GatewayTimeout(message, code=kind)
    return _CLIENT_FAULTS.get(kind, JobFailed)(message, code=kind)


def _error_response(err: ApiError) -> ErrorResponse:
    return ErrorResponse(err.body(), status_code=err.status, headers=err.headers())


async def _on_api_error(request: Request, exc: Exception) -> ErrorResponse:
    assert isinstance(exc, ApiError)
    return _error_response(exc)


async def _on_validation_error(request: Request, exc: Exception) -> ErrorResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ())]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return _error_response(ApiError(f"request body is not valid JSON: {detail}", code="invalid_json"))
    # One field, one sentence: the first error (``param`` names it); the next shows once it is fixed.
    where = ".".join(loc[1:]) or (loc[0] if loc else "body")
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    param = ".".join(loc[1:]) or (loc[0] if loc else None)
    return _error_response(ApiError(f"{where}: {message}", param=param, code="invalid_request"))


async def _on_http_error(request: Request, exc: Exception) -> ErrorResponse:
    assert isinstance(exc, StarletteHTTPException)
    kinds = {404: "not_found_error", 405: "invalid_request_error"}
    body = {
        "error": {
            "message": str(exc.detail),
            "type": kinds.get(exc.status_code, "invalid_request_error"),
            "param": None,
            "code": {404: "unknown_route", 405: "method_not_allowed"}.get(exc.status_code),
        }
    }
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed(request)
    return ErrorResponse(body, status_code=exc.status_code, headers=headers)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed(request: Request) -> str:
    """Every method some route serves on this path: the router's own ``Allow`` names only the
    first route that matched it (``GET`` on ``/v1/jobs/{id}``, whose ``DELETE`` is another)."""
    routes = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)
    ]
    return ", ".join(allowed)


async def _on_invalid_body(request: Request, exc: Exception) -> ErrorResponse:
    assert isinstance(exc, InvalidBody)
    return _error_response(ApiError(str(exc), param=exc.param, code=exc.type))


async def _on_not_found(request: Request, exc: Exception) -> ErrorResponse:
    return _error_response(NotFound(str(exc), code="job_not_found"))


async def _on_overspill_error(request: Request, exc: Exception) -> ErrorResponse:
    return _error_response(ApiError(str(exc)))


async def _on_redis_error(request: Request, exc: Exception) -> ErrorResponse:
    log.error("redis unavailable", error=str(exc)[:200])
    err = JobFailed("the job store is unavailable; retry shortly", code="store_unavailable")
    return ErrorResponse(err.body(), status_code=503, headers={"Retry-After": "1"})


async def _on_recursion(request: Request, exc: Exception) -> ErrorResponse:
    # Python's JSON parser recurses once per nesting level: only input nests this deep.
    return _error_response(
        ApiError(f"request body nests deeper than {MAX_DEPTH} levels", code="invalid_json")
    )


async def _on_crash(request: Request, exc: Exception) -> ErrorResponse:
    log.error("request crashed", error_type=type(exc).__name__, exc_info=exc)
    err = JobFailed("internal error", code="internal_error")
    # The request may have been left half-read: say the connection ends rather than drop it.
    return ErrorResponse(err.body(), status_code=500, headers={"Connection": "close"})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(InvalidBody, _on_invalid_body)
    app.add_exception_handler(JobNotFound, _on_not_found)
    app.add_exception_handler(OverspillError, _on_overspill_error)
    app.add_exception_handler(RedisError, _on_redis_error)
    app.add_exception_handler(RecursionError, _on_recursion)
    app.add_exception_handler(Exception, _on_crash)
