"""The worker's model catalogue, published to Redis for the API's ``GET /v1/models``."""

from __future__ import annotations

import time
from typing import Any, Literal

import structlog

from producer.contract import Keys, ModelCard, publish_models

from ..backends.remote.providers import RemotePool
from ..core.settings import WorkerConfig

log = structlog.get_logger()


def model_cards(config: WorkerConfig, remote: RemotePool | None, now: float | None = None) -> list[ModelCard]:
    """One card per configured model, saying whether Triton, the remotes, or both serve it."""
    created = int(now if now is not None else time.time())
    cards = []
    for spec in config.models:
        served: list[Literal["local", "remote"]] = [] if spec.remote_only else ["local"]
        if remote is not None and remote.serves(spec):
            served.append("remote")
        if served:  # a remote-only model without a remote is not served at all
            cards.append(
                ModelCard(id=spec.name, created=created, kind=spec.kind, served=served, aliases=spec.aliases)
            )
    return cards


async def publish_catalogue(redis: Any, config: WorkerConfig, remote: RemotePool | None) -> None:
    cards = model_cards(config, remote)
    await publish_models(redis, Keys(config.prefix), cards)
    log.info("models published", models=[c.id for c in cards])
