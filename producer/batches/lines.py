"""Batch input and output lines, in the OpenAI Batch formats; pure functions, no I/O but files.

Input line: ``{"custom_id", "method": "POST", "url", "body"}``. Checked in two passes over the
streamed file (never held whole in memory):

1. :func:`validate_file` checks the file as a whole. Problems here fail the batch (status
   ``failed``, ``errors.data[{code, message, param, line}]``), as OpenAI does: a line that is
   not JSON, a missing or duplicate ``custom_id``, a method other than POST, an unknown url or
   one other than the batch's endpoint, a body that is not an object, more than
   ``max_lines`` requests (or embedding inputs), an empty file.
2. :func:`read_chunk` reads the next requests for submission and checks each body against
   its kind (:func:`producer.contract.parse_body`). A bad body fails that line only: it goes to the
   error file as a 400 response, and the other lines run.

Output line: ``{"id": "batch_req_…", "custom_id", "response": {"status_code", "request_id",
"body"}, "error"}``. A success has status 200 and the job's body. A request the service
rejected as the caller's fault (4xx: bad body, unknown model) has ``error: null`` and the
OpenAI error object in ``response.body.error``; any other failure (worker crash, backend
error, cancelled, expired) has ``response: null`` and ``error: {code, message}``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel
from pydantic_core import to_json

from ..contract import (
    CHUNK_PREFIX,
    PACKED_TAIL,
    InvalidBody,
    JobKind,
    Limits,
    chunk_of,
    parse_body,
    portable_problem,
    unpack_body,
)

ENDPOINT_KINDS: dict[str, JobKind] = {
    "/v1/embeddings": JobKind.embed,
    "/v1/chat/completions": JobKind.chat,
    "/v1/rerank": JobKind.rerank,
}

# Job error types that are the request's fault, and the HTTP status OpenAI would answer.
CLIENT_ERRORS: dict[str, int] = {
    "invalid_request": 400,
    "limit_exceeded": 400,
    "model_error": 400,
    "remote_rejected": 400,
    "model_not_found": 404,
}


class LineError(BaseModel):
    """One entry of a batch's ``errors.data``."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


@dataclass
class Validation:
    total: int = 0  # requests (non-blank lines)
    inputs: int = 0  # embedding inputs over all lines
    errors: list[LineError] = field(default_factory=list)
    dropped: int = 0  # errors beyond the kept ones


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------- validation


def validate_file(
    path: Path, endpoint: str, *, max_lines: int, max_inputs: int, max_errors: int = 100
) -> Validation:
    """Check a batch input file line by line (streamed). ``errors`` empty means it is valid."""
    v = Validation()
    seen: set[str] = set()

    def add(error: LineError) -> None:
        if len(v.errors) < max_errors:
            v.errors.append(error)
        else:
            v.dropped += 1

    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            v.total += 1
            if v.total > max_lines:
                add(
                    LineError(
                        code="too_many_requests",
                        message=f"a batch holds at most {max_lines} requests",
                        line=lineno,
                    )
                )
                break
            error, inputs = check_line(raw, lineno, endpoint, seen)
            v.inputs += inputs
            if error is not None:
                add(error)
    if v.total == 0:
        add(LineError(code="empty_file", message="the input file has no requests"))
    if v.inputs > max_inputs:
        add(LineError(code="too_many_inputs", message=f"a batch holds at most {max_inputs} embedding inputs"))
    return v


def check_line(raw: bytes, lineno: int, endpoint: str, seen: set[str]) -> tuple[LineError | None, int]:
    """The file-level problem of one line, if any, and its number of embedding inputs."""

    def bad(code: str, message: str, param: str | None = None) -> tuple[LineError, int]:
        return LineError(code=code, message=message, param=param, line=lineno), 0

    try:
        obj = json.loads(raw)
    except ValueError as exc:
        return bad("invalid_json_line", f"line {lineno} is not valid JSON: {exc}")
    except RecursionError:
        return bad("invalid_json_line", f"line {lineno} nests too deeply")
    if not isinstance(obj, dict):
        return bad("invalid_json_line", f"line {lineno} is not a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return bad("missing_required_parameter", "custom_id is required and must be a string", "custom_id")
    if portable_problem(custom_id, "custom_id") is not None or len(custom_id) > 512:
        return bad("invalid_value", "custom_id must be valid Unicode of at most 512 characters", "custom_id")
    if custom_id in seen:
        return bad("duplicate_custom_id", f"custom_id {custom_id!r} appears more than once", "custom_id")
    seen.add(custom_id)
    if obj.get("method") != "POST":
        return bad("invalid_method", "method must be 'POST'", "method")
    url = obj.get("url")
    if url not in ENDPOINT_KINDS:
        return bad("invalid_url", f"url must be one of {', '.join(ENDPOINT_KINDS)}", "url")
    if url != endpoint:
        return bad("mismatched_url", f"url {url!r} differs from the batch's endpoint {endpoint!r}", "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        return bad("invalid_body", "body must be a JSON object", "body")
    inputs = body.get("input")
    return None, len(inputs) if isinstance(inputs, list) else 1


# ---------------------------------------------------------------------------- submission


class Prepared(NamedTuple):
    """A request ready to submit, or (``error`` set) a line that fails on its own."""

    custom_id: str
    body: dict[str, Any] | None
    error: dict[str, str] | None


def read_chunk(
    path: Path, offset: int, count: int, kind: JobKind, limits: Limits
) -> tuple[list[Prepared], int]:
    """Up to ``count`` requests from byte ``offset`` of a validated file, and the next offset."""
    out: list[Prepared] = []
    with open(path, "rb") as f:
        f.seek(offset)
        while len(out) < count:
            raw = f.readline()
            if not raw:
                break
            if not raw.strip():
                continue
            obj = json.loads(raw)
            try:
                parse_body(kind, obj["body"], limits)
                if obj["body"].get("stream") is True:  # a batch line has no one to stream to
                    raise InvalidBody("stream is not supported in a batch request", param="stream")
            except InvalidBody as exc:
                error = {"code": exc.type, "message": str(exc)}
                if exc.param is not None:
                    error["param"] = exc.param
                out.append(Prepared(obj["custom_id"], None, error))
                continue
            out.append(Prepared(obj["custom_id"], obj["body"], None))
        return out, f.tell()


def read_custom_ids(path: Path, offset: int) -> list[str]:
    """The custom_ids of a validated file from byte ``offset`` on (the lines never submitted)."""
    ids: list[str] = []
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            if raw.strip():
                ids.append(json.loads(raw)["custom_id"])
    return ids


class Entry(NamedTuple):
    """What the batch records per request line, in order: its job, or why it has none."""

    custom_id: str
    job_id: str | None
    error: dict[str, str] | None

    def encode(self) -> str:
        return _dumps(list(self))

    @classmethod
    def decode(cls, raw: str) -> Entry:
        custom_id, job_id, error = json.loads(raw)
        return cls(custom_id, job_id, error)


# ---------------------------------------------------------------------------- output


def line_id(batch_id: str, index: int, job_id: str | None) -> str:
    located = chunk_of(job_id) if job_id else None
    if located is not None:  # chk_<24 hex>.<index>: hex only, like a job's own
        return f"batch_req_{located[0].removeprefix(CHUNK_PREFIX)}{located[1]:04x}"
    if job_id:
        return "batch_req_" + job_id.removeprefix("job_")
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{index}".encode()).hexdigest()[:24]


def _line(request_line: str, custom_id: str, response: str | None, error: dict[str, str] | None) -> str:
    return (
        f'{{"id":"{request_line}","custom_id":{_dumps(custom_id)},'
        f'"response":{response if response is not None else "null"},"error":{_dumps(error)}}}'
    )


def _response(status_code: int, request_id: str | None, body_json: str) -> str:
    return f'{{"status_code":{status_code},"request_id":{_dumps(request_id)},"body":{body_json}}}'


def success_body(result: str) -> str | None:
    """The ``body`` of a result envelope as raw JSON text, without re-encoding its floats.

    The envelope is ``JobResult`` as pydantic writes it, fields in declaration order: ``body``
    follows ``model`` and, for a success (``error`` left out), precedes ``timings``. Decoding
    and re-encoding a 384-float embedding costs ~0.7 ms; this slice ~2 µs. If the text does not
    look as expected, the envelope is decoded properly.
    """
    if result.endswith(PACKED_TAIL):  # floats asked for, base64 stored: unpack
        body = json.loads(result).get("body")
        # pydantic-core's serializer: several times faster than json.dumps on floats.
        return to_json(unpack_body(body)).decode() if isinstance(body, dict) else None
    start = result.find(',"body":')
    end = result.rfind(',"timings":')
    if start != -1 and end > start:
        body = result[start + 8 : end]
        if body.startswith("{") and body.endswith("}"):
            return body
    try:
        parsed = json.loads(result).get("body")
    except (ValueError, AttributeError):
        return None
    return _dumps(parsed) if isinstance(parsed, dict) else None


def client_error_body(code: str, message: str, status: int = 400, param: str | None = None) -> str:
    """The OpenAI error object the sync API answers with for the same request (same type)."""
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    return _dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def output_line(
    batch_id: str, index: int, entry: Entry, status: str | None, result: str | None, outcome: str
) -> tuple[bool, str]:
    """One request's output line: (True, line) for the output file, (False, line) for errors.

    ``outcome`` is how the batch ends (``completed``, ``cancelled``, ``expired``): it names
    what happened to a request that never ran.
    """
    rid = line_id(batch_id, index, entry.job_id)
    if entry.error is not None:
        body = client_error_body(entry.error["code"], entry.error["message"], param=entry.error.get("param"))
        # Never a job: the line's own id stands for the request, so every line carries one.
        return False, _line(rid, entry.custom_id, _response(400, rid, body), None)
    if status == "succeeded" and result is not None:
        body_json = success_body(result)
        if body_json is not None:
            return True, _line(rid, entry.custom_id, _response(200, entry.job_id, body_json), None)
        return False, _line(
            rid, entry.custom_id, None, {"code": "result_unreadable", "message": "unreadable result"}
        )
    return False, _failure_line(rid, entry, status, result, outcome)


def _failure_line(rid: str, entry: Entry, status: str | None, result: str | None, outcome: str) -> str:
    never_ran = "batch_expired" if outcome == "expired" else "batch_cancelled"
    if status is None:
        return _line(
            rid, entry.custom_id, None, {"code": "result_missing", "message": "the job's result is gone"}
        )
    if status in ("queued", "running", "cancelled"):
        return _line(
            rid,
            entry.custom_id,
            None,
            {"code": never_ran, "message": f"request not run: the batch was {outcome}"},
        )
    if status == "expired":
        return _line(
            rid, entry.custom_id, None, {"code": "batch_expired", "message": "the batch's window passed"}
        )
    error = _result_error(result)
    http = CLIENT_ERRORS.get(error["code"])
    if http is not None:
        body = client_error_body(error["code"], error["message"], http)
        return _line(rid, entry.custom_id, _response(http, entry.job_id, body), None)
    return _line(rid, entry.custom_id, None, error)


def _result_error(result: str | None) -> dict[str, str]:
    try:
        err = json.loads(result or "{}").get("error") or {}
    except (ValueError, AttributeError):
        err = {}
    return {
        "code": str(err.get("type", "internal_error")),
        "message": str(err.get("message", "the request failed")),
    }


def unsubmitted_line(batch_id: str, index: int, custom_id: str, outcome: str) -> str:
    code = "batch_expired" if outcome == "expired" else "batch_cancelled"
    error = {"code": code, "message": f"request not run: the batch was {outcome}"}
    return _line(line_id(batch_id, index, None), custom_id, None, error)


def write_page(
    batch_id: str,
    start: int,
    entries: Sequence[Entry],
    records: Sequence[tuple[str | None, str | None]],
    outcome: str,
    out: Any,
    err: Any,
) -> tuple[int, int]:
    """Write one page of entries (results fetched alongside) to the output and error files."""
    n_out = n_err = 0
    good: list[str] = []
    bad: list[str] = []
    for i, (entry, (status, result)) in enumerate(zip(entries, records, strict=True)):
        success, line = output_line(batch_id, start + i, entry, status, result, outcome)
        (good if success else bad).append(line)
    if good:
        out.write("\n".join(good) + "\n")
        n_out = len(good)
    if bad:
        err.write("\n".join(bad) + "\n")
        n_err = len(bad)
    return n_out, n_err


def write_unsubmitted(
    path: Path, batch_id: str, offset: int, first_index: int, outcome: str, err: Any
) -> int:
    """Error lines for the requests never submitted (from byte ``offset``); how many."""
    ids = read_custom_ids(path, offset)
    for i, custom_id in enumerate(ids):
        err.write(unsubmitted_line(batch_id, first_index + i, custom_id, outcome) + "\n")
    return len(ids)
