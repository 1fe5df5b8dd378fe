"""Every parameter of every operation at its edges: dates, integers, lengths and patterns.

Read from the API's own OpenAPI document, each query, path and header parameter is sent at
the values its schema admits last (the minimum, the maximum, the longest string, the first and
last day of the calendar) and at the first ones it refuses, one parameter at a time, with a
tenant's key and an admin's. No answer is a 5xx; a value the schema admits is never refused
(400/422); a value it refuses is answered 400 or 422 naming the parameter. A fuzzer finds
these edges by chance; this walks them every run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.fixtures_api import ApiServer, TenantKeys

REFUSALS = (400, 422)


@dataclass(frozen=True)
class Edge:
    value: str
    admitted: bool  # does the parameter's schema admit this value?


def _branches(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null branches of a parameter's schema."""
    branches = schema.get("anyOf", [schema])
    return [b for b in branches if b.get("type") != "null"]


def _numbers(schema: dict[str, Any]) -> Iterator[Edge]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if lo is not None:
        yield Edge(str(lo), True)
        yield Edge(str(lo - 1), False)
    if hi is not None:
        yield Edge(str(hi), True)
        yield Edge(str(hi + 1), False)
    yield Edge(str(2**63), hi is None)  # past every 64-bit integer
    yield Edge("1e400", False)  # no finite number
    yield Edge("nan", False)


def _strings(schema: dict[str, Any]) -> Iterator[Edge]:
    if schema.get("format") == "date":
        yield from (Edge("0001-01-01", True), Edge("0001-01-05", True), Edge("9999-12-31", True))
        yield from (Edge("0000-01-01", False), Edge("2026-02-29", False), Edge("20261207", False))
        yield Edge("2026-W49-1", False)
        return
    if "enum" in schema:
        yield from (Edge(str(v), True) for v in schema["enum"])
        yield Edge("x" + str(schema["enum"][0]), False)
        return
    if "pattern" in schema:
        return  # patterns are walked per parameter below (PATTERNS): a regex has no generic edge
    longest = schema.get("maxLength")
    if longest is not None:
        yield Edge("é" * longest, True)
        yield Edge("a" * (longest + 1), False)
    else:
        yield Edge("a" * 4000, True)
    yield Edge("\u202e%00", longest is None or longest >= 4)


# Parameters whose schema is a pattern: its last admitted values and its first refused ones.
PATTERNS = {
    "Last-Event-ID": [
        Edge("0", True),
        Edge("9" * 19, True),
        Edge("9" * 19 + "-" + "9" * 19, True),
        Edge("9" * 20, False),
        Edge("1-", False),
    ],
    "lane": [Edge("interactive", True), Edge("bulk", True), Edge("bulkk", False)],
}


def edges(param: dict[str, Any]) -> list[Edge]:
    if param["name"] in PATTERNS:
        return PATTERNS[param["name"]]
    out: list[Edge] = []
    for branch in _branches(param.get("schema", {})):
        if branch.get("type") in ("integer", "number"):
            out.extend(_numbers(branch))
        elif branch.get("type") == "string" or "enum" in branch:
            out.extend(_strings(branch))
    if param["in"] == "path":  # any text is a schema-valid id; an unknown one is a 404
        out = [e for e in out if e.admitted] + [Edge("a" * 2000, True), Edge("..", True)]
    return out


@dataclass(frozen=True)
class Probe:
    method: str
    path: str
    param: dict[str, Any]
    edge: Edge


def probes(document: dict[str, Any]) -> list[Probe]:
    """One request per parameter edge, for every operation that needs no body."""
    out = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if operation.get("requestBody", {}).get("required"):
                continue  # bodies are the fuzz's (tests/test_fuzz.py)
            for param in operation.get("parameters", []):
                out.extend(Probe(method.upper(), path, param, edge) for edge in edges(param))
    return out


def send(client: httpx.Client, probe: Probe, headers: dict[str, str]) -> httpx.Response:
    name, value = probe.param["name"], probe.edge.value
    where = probe.param["in"]
    path = "/".join(
        (value if part == "{" + name + "}" else "none") if part.startswith("{") else part
        for part in probe.path.split("/")
    )  # the other path parameters: an id nobody has
    params = {name: value} if where == "query" else {}
    extra = {name: value} if where == "header" else {}
    for _ in range(20):  # a key's rate limit answers 429 with a Retry-After: wait, as a client does
        answer = client.request(probe.method, path, params=params, headers={**headers, **extra}, timeout=30)
        if answer.status_code != 429:
            return answer
        time.sleep(min(2.0, float(answer.headers.get("Retry-After", "1"))))
    return answer


@pytest.fixture(scope="module")
def document(api_stack: ApiServer) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{api_stack.url}/openapi.json", timeout=10).json()
    return doc


@pytest.mark.parametrize("who", ["wide", "ops"])  # a tenant's key, an admin's
def test_every_parameter_answers_at_its_edges(
    api_stack: ApiServer, tenants: TenantKeys, document: dict[str, Any], who: str
) -> None:
    headers = tenants.headers(who)
    cases = probes(document)
    assert len(cases) >= 100, "the document lost its parameters"
    wrong: list[str] = []
    with httpx.Client(base_url=api_stack.url) as client:
        for probe in cases:
            answer = send(client, probe, headers)
            label = f"{probe.method} {probe.path} {probe.param['name']}={probe.edge.value[:40]!r}"
            if answer.status_code >= 500:
                wrong.append(f"{label}: {answer.status_code} {answer.text[:200]}")
            elif probe.edge.admitted and answer.status_code in REFUSALS:
                wrong.append(f"{label}: admitted by the schema, refused {answer.text[:200]}")
            elif not probe.edge.admitted and answer.status_code not in REFUSALS:
                wrong.append(f"{label}: refused by the schema, answered {answer.status_code}")
            elif not probe.edge.admitted and probe.param["name"] not in answer.text:
                wrong.append(f"{label}: the refusal does not name the parameter: {answer.text[:200]}")
    assert not wrong, "\n".join(wrong)
