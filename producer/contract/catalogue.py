"""The model catalogue: what this deployment serves, published by the workers for the API.

The API must not import the workers' settings, so each worker writes one card per model
(local and remote) to a Redis hash at start; ``GET /v1/models`` reads the union.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from .capabilities import Offers
from .keys import Keys
from .kinds import JobKind


class ModelCard(BaseModel):
    """One served model, in OpenAI's ``model`` object shape plus where it runs."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "overspill"
    kind: JobKind
    served: list[Literal["local", "remote"]] = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    # What the model offers beyond text (tools, response_format, logprobs, context), where it
    # runs: the API refuses a request no place can serve before it is queued.
    offers: dict[Literal["local", "remote"], Offers] = Field(default_factory=dict)

    def names(self) -> set[str]:
        return {self.id, *self.aliases}


async def publish_models(redis: Any, keys: Keys, cards: list[ModelCard]) -> None:
    """Write ``cards`` (a worker's view of its models); workers of one deployment agree."""
    if cards:
        await redis.hset(keys.models(), mapping={c.id: c.model_dump_json() for c in cards})


async def read_models(redis: Any, keys: Keys) -> list[ModelCard]:
    """Every published card, sorted by id."""
    raw = await redis.hgetall(keys.models())
    cards = [ModelCard.model_validate(json.loads(v)) for v in raw.values()]
    return sorted(cards, key=lambda c: c.id)
