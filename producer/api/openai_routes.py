"""OpenAI-compatible synchronous endpoints: ``/v1/embeddings``, ``/v1/chat/completions``, ``/v1/rerank``,
and the model list ``GET /v1/models`` (``/v1/models/{id}``), read from the workers' catalogue.

Each request becomes one interactive job; the answer is the job's OpenAI/Cohere body, so the
OpenAI SDKs work unchanged. These are the API's hot path, so they are plain Starlette routes,
without FastAPI's per-request dependency solving and parameter validation (the API's CPU per
request, which bounds its rate on a small machine, is recorded by ``python -m bench p6``).
Nothing is lost by it: the body is validated once, against the contract, when the job is submitted;
errors go through the app's exception handlers like every other route's; and the OpenAPI
entries are generated from the contract's request models (:func:`add_openapi_paths`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_json
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..contract import (
    MAX_DEPTH,
    ChatRequest,
    EmbeddingRequest,
    JobKind,
    Keys,
    RerankRequest,
    TenantSpec,
    read_models,
)
from ..errors import ApiError, NotFound
from . import stream_routes
from .error_handlers import ErrorResponse
from .state import idempotency_of


class SyncApi(Protocol):
    """What the routes need of the API's shared state (``producer.api.ApiState``)."""

    redis: Any
    keys: Keys

    async def authenticate(self, request: Request) -> TenantSpec: ...

    async def run_sync(
        self, tenant: TenantSpec, kind: JobKind, body: dict[str, Any], idempotency_key: str | None
    ) -> dict[str, Any]: ...


# path → (job kind, request model for the docs, summary)
ROUTES: dict[str, tuple[JobKind, type[BaseModel], str]] = {
    "/v1/embeddings": (
        JobKind.embed,
        EmbeddingRequest,
        "OpenAI embeddings (encoding_format float or base64)",
    ),
    "/v1/chat/completions": (
        JobKind.chat,
        ChatRequest,
        "OpenAI chat completions (text; stream: true answers server-sent events; no tools)",
    ),
    "/v1/rerank": (JobKind.rerank, RerankRequest, "Cohere/Jina rerank"),
}


class BodyResponse(ErrorResponse):
    """A worker's answer body, serialized by pydantic-core (several times faster than json.dumps
    on a list of floats); text UTF-8 cannot carry (a remote's lone surrogate) is escaped as
    ASCII, as an error body is."""

    def render(self, content: object) -> bytes:
        try:
            return to_json(content)
        except PydanticSerializationError:
            return super().render(content)


async def json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong with it."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(f"request body nests deeper than {MAX_DEPTH} levels", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object", param="body", code="invalid_request")
    return body


def _endpoint(kind: JobKind) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        api: SyncApi = request.app.state.api
        tenant = await api.authenticate(request)
        body = await json_object(request)
        if kind == JobKind.chat and body.get("stream") is True:  # SSE: producer/api/stream_routes.py
            return await stream_routes.chat_stream(request, api, tenant, body)
        # Vectors come back as asked (floats or base64): the answer passes through.
        answer = await api.run_sync(tenant, kind, body, idempotency_of(request))
        return BodyResponse(answer)

    return endpoint


async def list_models(request: Request) -> JSONResponse:
    api: SyncApi = request.app.state.api
    await api.authenticate(request)
    cards = await read_models(api.redis, api.keys)
    return JSONResponse({"object": "list", "data": [c.model_dump(mode="json") for c in cards]})


async def get_model(request: Request) -> JSONResponse:
    api: SyncApi = request.app.state.api
    await api.authenticate(request)
    name = request.path_params["model"]
    for card in await read_models(api.redis, api.keys):
        if name in card.names():
            return JSONResponse(card.model_dump(mode="json"))
    raise NotFound(f"the model {name!r} is not served here", param="model", code="model_not_found")


def routes() -> list[Route]:
    posts = [Route(path, _endpoint(kind), methods=["POST"]) for path, (kind, _, _) in ROUTES.items()]
    # ``:path``: Hugging Face aliases hold a slash (``HuggingFaceTB/SmolLM2-135M-Instruct``).
    return [
        *posts,
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
    ]


def add_openapi_paths(schema: dict[str, Any]) -> dict[str, Any]:
    """Describe the routes in an OpenAPI document built by FastAPI (which does not see them)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, (_, model, summary) in ROUTES.items():
        spec = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(spec.pop("$defs", {}))
        components[model.__name__] = spec
        schema["paths"][path] = {
            "post": {
                "tags": ["openai"],
                "summary": summary,
                "security": [{"HTTPBearer": []}],
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string"},
                        "description": "Same key from the same tenant, same job",
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
                    },
                },
                "responses": {
                    "200": {"description": "The OpenAI/Cohere response body"},
                    "4XX": {"description": "An OpenAI-shaped error: {error: {message, type, param, code}}"},
                },
            }
        }
    errors = {"4XX": {"description": "An OpenAI-shaped error: {error: {message, type, param, code}}"}}
    listed = {"tags": ["openai"], "security": [{"HTTPBearer": []}]}
    schema["paths"]["/v1/models"] = {
        "get": {
            **listed,
            "summary": "The models served, locally and remotely (OpenAI list shape)",
            "responses": {"200": {"description": "{object: list, data: [model]}"}, **errors},
        }
    }
    schema["paths"]["/v1/models/{model}"] = {
        "get": {
            **listed,
            "summary": "One served model, by id or alias",
            "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "The model object"}, **errors},
        }
    }
    return schema
