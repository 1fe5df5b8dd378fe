"""The remote backends: OpenAI-compatible HTTP APIs, their retry loop, SSE, response schemas,
providers in order of fallback, and the rate limits they share in Redis.
"""

from .client import RemoteBackend
from .config import ApiKey, RemoteConfig, redact
from .handlers import RemoteHandlers
from .providers import Provider, RemotePool
from .providers_file import (
    LocalPrice,
    Price,
    ProvidersConfig,
    ProvidersFile,
    ProvidersFileError,
    ProviderSpec,
    env_provider,
    load_providers,
    parse_document,
)
from .ratelimit import Lease, ProviderLimits, SharedLimiter, estimate_tokens, reported_tokens
from .schemas import Chat, Choice, EmbeddingDatum, Embeddings, Message, Rerank, RerankResult, Usage, parse
from .sse import ChunkParser, stream_payload

__all__ = (
    "ApiKey",
    "Chat",
    "Choice",
    "ChunkParser",
    "EmbeddingDatum",
    "Embeddings",
    "Lease",
    "LocalPrice",
    "Message",
    "Price",
    "Provider",
    "ProviderLimits",
    "ProviderSpec",
    "ProvidersConfig",
    "ProvidersFile",
    "ProvidersFileError",
    "RemoteBackend",
    "RemoteConfig",
    "RemoteHandlers",
    "RemotePool",
    "Rerank",
    "RerankResult",
    "SharedLimiter",
    "Usage",
    "env_provider",
    "estimate_tokens",
    "load_providers",
    "parse",
    "parse_document",
    "redact",
    "reported_tokens",
    "stream_payload",
)
