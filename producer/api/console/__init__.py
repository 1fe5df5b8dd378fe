"""The operations console: ``GET /console`` (a static page, no build step, nothing from a CDN)
and the ``/v1/console/*`` reads and actions it makes with the viewer's API key."""

from .overview import read_overview
from .routes import console_router

__all__ = ("console_router", "read_overview")
