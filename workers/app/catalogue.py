"""The worker's model catalogue, published to Redis for the API's ``GET /v1/models``."""

from __future__ import annotations

import time
from typing import Any, Literal

import structlog

from producer.contract import JobKind, Keys, ModelCard, Offers, publish_models

from ..backends.remote.providers import RemotePool
from ..core.settings import ModelSpec, WorkerConfig

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
            card = ModelCard(
                id=spec.name, created=created, kind=spec.kind, served=served, aliases=spec.aliases
            )
            if spec.kind == JobKind.chat:
                card.offers = _offers(spec, remote)
            cards.append(card)
    return cards


def _offers(spec: ModelSpec, remote: RemotePool | None) -> dict[Literal["local", "remote"], Offers]:
    """What the model offers where it runs (the remotes' between them), for the API's check."""
    offers: dict[Literal["local", "remote"], Offers] = {}
    if not spec.remote_only:
        offers["local"] = spec.offers
    if remote is not None and (union := remote.offers(spec)) is not None:
        offers["remote"] = union
    return offers


async def publish_catalogue(redis: Any, config: WorkerConfig, remote: RemotePool | None) -> None:
    cards = model_cards(config, remote)
    await publish_models(redis, Keys(config.prefix), cards)
    log.info("models published", models=[c.id for c in cards])
