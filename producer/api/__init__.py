"""The HTTP API server: job routes, OpenAI-compatible endpoints, Batch routes, webhooks, ops.

Lives here: the FastAPI app, its state, tenants and rate limits, middleware, error handlers.
May import ``producer.contract``, ``producer.errors``, ``producer.client`` and ``producer.batches``.
"""

from .app import create_app, main
from .settings import ApiSettings
from .state import ApiState

__all__ = ("ApiSettings", "ApiState", "create_app", "main")
