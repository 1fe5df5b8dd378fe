"""The OpenAPI document says what the server enforces, so a request it calls valid is accepted.

FastAPI and pydantic describe types; the server also holds this deployment's limits, the
batch windows it offers, the features the local models lack, and a few rules between fields.
:func:`tighten` writes those into the document the app serves (schemathesis checks that every
schema-valid request is accepted, ``tests/test_fuzz.py``). Rules JSON Schema cannot state (a
period's end before its start) are answered 400 and described in the operation's text.
"""

from __future__ import annotations

from typing import Any

from ..batches import BatchSettings
from ..batches.files import MAX_EXPIRY_S
from ..batches.lines import ENDPOINT_KINDS
from ..contract import (
    DAY_PATTERN,
    EVENT_ID_PATTERN,
    INT_MAX,
    INT_MIN,
    LANE_MAX_DEADLINE_S,
    Capability,
    JobKind,
    Lane,
    Limits,
)
from .batch_routes import ANCHOR, SECONDS

NULL = {"type": "null"}
# Holds a character Python's str.strip() keeps (what the server checks): not \s, and not the
# separators \x1c-\x1f and \x85, which Python counts as whitespace and JavaScript does not.
NOT_BLANK = r"[^\s\x1c-\x1f\x85]"
BODIES = {JobKind.embed: "EmbeddingRequest", JobKind.chat: "ChatRequest", JobKind.rerank: "RerankRequest"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, NULL], "default": None}


def _chat(s: dict[str, Any], limits: Limits, offered: frozenset[Capability]) -> None:
    """Limits, and the features of ``offered`` only: a request for one no model here offers is
    refused (tools, a JSON response_format, logprobs), and none of them is streamed."""
    p = s["properties"]
    tokens = {"type": "integer", "minimum": 1, "maximum": limits.max_chat_tokens}
    p["max_tokens"] = _nullable(tokens)
    p["max_completion_tokens"] = _nullable(tokens)
    p["messages"]["maxItems"] = limits.max_chat_messages
    p["seed"] = _nullable({"type": "integer", "minimum": INT_MIN, "maximum": INT_MAX})
    p["n"] = {"const": 1, "default": 1, "description": "one choice per request"}
    plain = {
        "tools": _nullable({"type": "array", "maxItems": 0}),
        "tool_choice": _nullable({"const": "none"}),
        "response_format": _nullable({"type": "object", "properties": {"type": {"const": "text"}}}),
        "logprobs": _nullable({"const": False}),
        "top_logprobs": _nullable({"const": 0}),
        "messages": {"type": "array", "items": {"type": "object", "properties": {
            "role": {"not": {"const": "tool"}}, "tool_calls": _nullable({"type": "array", "maxItems": 0})}}},
    }  # fmt: skip
    refused = {  # the request fields of each feature, as they are where no model offers it
        Capability.tools: ("tools", "tool_choice"),
        Capability.response_format: ("response_format",),
        Capability.logprobs: ("logprobs", "top_logprobs"),
    }
    for cap, fields in refused.items():
        if cap not in offered:
            p.update({field: plain[field] for field in fields})
    if Capability.response_format in offered:
        formats = ["text", "json_object", "json_schema"]
        p["response_format"] = _nullable({"type": "object", "properties": {"type": {"enum": formats}}})
    if Capability.tools not in offered:  # no tool messages, no assistant tool calls
        s.setdefault("allOf", []).append({"properties": {"messages": plain["messages"]}})
    s.setdefault("allOf", []).extend([
        # stream_options only with stream: true.
        {"anyOf": [
            {"properties": {"stream_options": NULL}},
            {"properties": {"stream": {"const": True}}, "required": ["stream"]},
        ]},
        # tools, JSON formats and logprobs are answered unstreamed.
        {"anyOf": [
            {"properties": {"stream": {"const": False}}},
            {"properties": plain},
        ]},
    ])  # fmt: skip
    s.pop("anyOf", None)


def _embedding(s: dict[str, Any], limits: Limits) -> None:
    p = s["properties"]
    text = {"type": "string", "pattern": NOT_BLANK, "maxLength": limits.max_input_chars}
    p["input"] = {
        "anyOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": limits.max_embed_inputs}]
    }
    p["dimensions"] = {**NULL, "description": "the served models are not trained for truncation"}


def _rerank(s: dict[str, Any], limits: Limits) -> None:
    p = s["properties"]
    p["query"]["maxLength"] = limits.max_input_chars
    p["documents"]["maxItems"] = limits.max_rerank_documents
    p["top_n"] = _nullable({"type": "integer", "minimum": 1, "maximum": INT_MAX})


# Models that take unknown fields as they come (an OpenAI server ignores most): any value the
# wire can carry (contract/portable.py), which JSON Schema says as this recursive definition.
PORTABLE_REF = {"$ref": "#/components/schemas/Portable"}
PORTABLE = {
    "description": "Any JSON value the wire carries: integers within 64 bits, nesting within 64 levels",
    "anyOf": [
        {"type": "string"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "number", "minimum": INT_MIN, "maximum": INT_MAX},
        {"type": "array", "items": PORTABLE_REF},
        {"type": "object", "additionalProperties": PORTABLE_REF},
    ],
}
OPEN_MODELS = (
    "EmbeddingRequest",
    "ChatRequest",
    "RerankRequest",
    "RerankDocument",
    "ChatMessage",
    "TextPart",
    "StreamOptions",
)


def _open_objects(node: Any) -> None:
    """Every object that takes any field (``dict[str, Any]`` in a model: tool definitions, tool
    calls, a tool choice) takes portable values only, as the server checks."""
    if isinstance(node, dict):
        if node.get("additionalProperties") is True:
            node["additionalProperties"] = PORTABLE_REF
        for value in node.values():
            _open_objects(value)
    elif isinstance(node, list):
        for value in node:
            _open_objects(value)


def _message(s: dict[str, Any]) -> None:
    """Content may be null for an assistant's message only, a tool's message names its call:
    three branches, as JSON Schema says it."""
    props = s["properties"]
    content = {"anyOf": [b for b in props["content"]["anyOf"] if b.get("type") != "null"]}
    others = [r for r in props["role"]["enum"] if r not in ("assistant", "tool")]
    common = {"type": "object", "additionalProperties": PORTABLE_REF}
    assistant = {**common, "properties": {**props, "role": {"const": "assistant"}}, "required": ["role"]}
    call_id = {"type": "string", "minLength": 1, "maxLength": 200}
    tool = {
        **common,
        "properties": {**props, "role": {"const": "tool"}, "content": content, "tool_call_id": call_id},
        "required": ["role", "content", "tool_call_id"],
    }
    other = {
        **common,
        "properties": {**props, "role": {"enum": others}, "content": content},
        "required": ["role", "content"],
    }
    s.clear()
    s.update({"title": "ChatMessage", "anyOf": [assistant, tool, other]})


# An absolute http(s) URL with a host name or IPv4 address, and a port that exists.
PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
WEBHOOK_URL = rf"^https?://{LABEL}(\.{LABEL})*(:{PORT})?(/[!-~]*)?$"


def _options(components: dict[str, Any]) -> None:
    """A job's options: the lane bounds its deadline (relative seconds here; an absolute epoch is
    taken too), ``local_only`` forbids ``route: remote``, a webhook is an http(s) URL."""
    s = components["ApiJobOptions"]
    p = s["properties"]
    p["idempotency_key"] = _nullable({"type": "string", "minLength": 1, "maxLength": 256})
    p["metadata"] = {"type": "object", "maxProperties": 16, "additionalProperties": {"type": "string"}}
    interactive = LANE_MAX_DEADLINE_S[Lane.interactive]
    p["deadline"] = _nullable(
        {"type": "number", "exclusiveMinimum": 0, "maximum": LANE_MAX_DEADLINE_S[Lane.bulk]}
    )
    short = {"properties": {"deadline": _nullable({"type": "number", "maximum": interactive})}}
    s["allOf"] = [
        {"anyOf": [{"properties": {"lane": {"const": Lane.bulk.value}}, "required": ["lane"]}, short]},
        {"not": {"properties": {"local_only": {"const": True}, "route": {"const": "remote"}}, "required": ["local_only", "route"]}},
    ]  # fmt: skip
    hook = components["Webhook"]["properties"]
    hook["url"] = {"type": "string", "maxLength": 2000, "pattern": WEBHOOK_URL}


def _job_submission(components: dict[str, Any]) -> None:
    """``POST /v1/jobs``: the body is the request of its kind, one branch per kind; only a chat
    job may be streamed."""
    _options(components)
    base = components["JobSubmission"]
    options = {"$ref": "#/components/schemas/ApiJobOptions"}
    unstreamed = {"allOf": [options, {"properties": {"stream": {"const": False}}}]}
    branches = [
        {**base, "properties": {
            **base["properties"],
            "kind": {"const": kind.value},
            "body": {"$ref": f"#/components/schemas/{name}"},
            "options": options if kind == JobKind.chat else unstreamed,
        }}
        for kind, name in BODIES.items()
    ]  # fmt: skip
    components["JobSubmission"] = {
        "title": base["title"],
        "description": base.get("description", ""),
        "anyOf": branches,
    }


def _parameter(schema: dict[str, Any], path: str, method: str, name: str, value: dict[str, Any]) -> None:
    for param in schema["paths"].get(path, {}).get(method, {}).get("parameters", []):
        if param["name"] == name:
            param["schema"] = value


def _upload(s: dict[str, Any], batches: BatchSettings) -> None:
    """``POST /v1/files``: a non-empty file for ``purpose=batch``; ``expires_after`` whole or absent."""
    p = s["properties"]
    # A multipart part is bytes: "true", "12" or "null" is a file's content as much as any text,
    # so whatever JSON value a generator puts there is a file, except none (an empty array sends
    # no part) or several (an array of two sends two): one non-empty part, whatever it holds.
    p["file"] = {
        "title": "File",
        "description": "The JSONL input of a batch: exactly one non-empty part",
        "contentMediaType": "application/octet-stream",
        "minLength": 1,
        "minItems": 1,
        "maxItems": 1,
        "items": {"minLength": 1},
    }
    p["purpose"] = {"type": "string", "enum": ["batch"]}
    anchor, seconds = ANCHOR, SECONDS
    p[anchor] = {"type": "string", "enum": ["created_at"]}
    p[seconds] = {"type": "integer", "minimum": batches.file_expiry_min_s, "maximum": MAX_EXPIRY_S}
    s["anyOf"] = [
        {"required": [anchor, seconds]},
        {"not": {"anyOf": [{"required": [anchor]}, {"required": [seconds]}]}},
    ]


def _batch(s: dict[str, Any], batches: BatchSettings) -> None:
    p = s["properties"]
    p["completion_window"] = {"type": "string", "enum": list(batches.batch_windows)}
    p["endpoint"] = {"type": "string", "enum": list(ENDPOINT_KINDS)}
    metadata = {
        "type": "object",
        "maxProperties": 16,
        "propertyNames": {"maxLength": 64},
        "additionalProperties": {"type": "string", "maxLength": 512},
    }
    p["metadata"] = _nullable(metadata)


# What each creating operation's answer leads to (OpenAPI links): a client, or a fuzzer's
# stateful phase, follows an id to the operations that read, stream, cancel or delete it.
LINKS: dict[tuple[str, str, str], dict[str, tuple[str, str, str]]] = {
    ("/v1/jobs", "post", "202"): {
        "GetJob": ("/v1/jobs/{job_id}", "get", "job_id"),
        "CancelJob": ("/v1/jobs/{job_id}", "delete", "job_id"),
        "JobEvents": ("/v1/jobs/{job_id}/events", "get", "job_id"),
        "JobWebhook": ("/v1/jobs/{job_id}/webhook", "get", "job_id"),
        "ConsoleJob": ("/v1/console/jobs/{job_id}", "get", "job_id"),
        "ConsoleCancelJob": ("/v1/console/jobs/{job_id}/cancel", "post", "job_id"),
    },
    ("/v1/files", "post", "200"): {
        "GetFile": ("/v1/files/{file_id}", "get", "file_id"),
        "FileContent": ("/v1/files/{file_id}/content", "get", "file_id"),
        "DeleteFile": ("/v1/files/{file_id}", "delete", "file_id"),
    },
    ("/v1/batches", "post", "200"): {
        "GetBatch": ("/v1/batches/{batch_id}", "get", "batch_id"),
        "CancelBatch": ("/v1/batches/{batch_id}/cancel", "post", "batch_id"),
        "ConsoleBatch": ("/v1/console/batches/{batch_id}", "get", "batch_id"),
        "ConsoleCancelBatch": ("/v1/console/batches/{batch_id}/cancel", "post", "batch_id"),
    },
}


def _links(schema: dict[str, Any]) -> None:
    paths = schema["paths"]
    for (path, method, status), links in LINKS.items():
        response = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
        if response is None:
            continue
        response["links"] = {
            name: {
                "operationId": paths[target][verb]["operationId"],
                "parameters": {param: "$response.body#/id"},
            }
            for name, (target, verb, param) in links.items()
            if verb in paths.get(target, {})
        }


def tighten(
    schema: dict[str, Any],
    limits: Limits,
    batches: BatchSettings,
    offered: frozenset[Capability] = frozenset(),
) -> dict[str, Any]:
    """``schema`` (the app's OpenAPI document) with this deployment's rules written in;
    ``offered``: the features some chat model here offers (the workers' catalogue)."""
    components = schema["components"]["schemas"]
    _open_objects(components)
    components["Portable"] = PORTABLE
    for name in OPEN_MODELS:
        components[name]["additionalProperties"] = PORTABLE_REF
    _message(components["ChatMessage"])
    _chat(components["ChatRequest"], limits, offered)
    _embedding(components["EmbeddingRequest"], limits)
    _rerank(components["RerankRequest"], limits)
    _job_submission(components)
    _batch(components["BatchCreate"], batches)
    _upload(components["Body_create_file_v1_files_post"], batches)
    day = {"type": "string", "format": "date", "pattern": DAY_PATTERN}
    _parameter(schema, "/v1/usage", "get", "start", day)
    _parameter(schema, "/v1/usage", "get", "end", day)
    for path in schema["paths"].values():
        for operation in path.values():
            for param in operation.get("parameters", []):
                if param["name"] == "Idempotency-Key":
                    param["schema"] = {"type": "string", "minLength": 1, "maxLength": 256}
    event_id = {"type": "string", "pattern": EVENT_ID_PATTERN}
    _parameter(schema, "/v1/jobs/{job_id}/events", "get", "Last-Event-ID", event_id)
    _links(schema)
    return schema
