"""The workers' model catalogue as the API checks it: an unknown model is refused before it is queued.

Workers publish their catalogue to Redis at start (``producer.contract.publish_models``). The API
reads it at most once per ``ttl_s`` and refuses a job or sync request whose model no worker
serves for that kind: 404, ``not_found_error``, code ``model_not_found``, OpenAI's shape. A model
missing from the cached copy is looked up again at once, so a worker that just published one is
not refused for the cache's lifetime. While no worker has ever published (an empty catalogue),
every model is accepted and the worker that takes the job decides.

A chat request needing what its model lacks where the job may run (tools, response_format,
logprobs, a longer context: ``ModelCard.offers``) is refused with a 400 naming the field, as
the worker would fail it: local only, or no remote that offers it.
"""

from __future__ import annotations

import time
from typing import Any

from ..contract import (
    DEFAULT_LIMITS,
    Capability,
    JobKind,
    Keys,
    Limits,
    ModelCard,
    parse_body,
    read_models,
    refusal,
)
from ..errors import ApiError, NotFound

RECHECK_S = 0.1  # a refused model re-reads the catalogue at most this often (a flood of them too)


class KnownModels:
    def __init__(self, redis: Any, keys: Keys, ttl_s: float = 2.0) -> None:
        self._redis = redis
        self._keys = keys
        self.ttl_s = ttl_s
        self._cards: list[ModelCard] = []
        self._kinds: dict[str, set[JobKind]] = {}  # every name (and alias) → the kinds it serves
        self._chat: dict[str, ModelCard] = {}  # every chat model's name (and alias) → its card
        self._read_at = -1e9  # monotonic time of the last read

    async def refresh(self) -> None:
        """Read the catalogue now."""
        await self._read()

    async def _read(self) -> None:
        self._cards = await read_models(self._redis, self._keys)
        self._kinds, self._chat = {}, {}
        for card in self._cards:
            for name in card.names():
                self._kinds.setdefault(name, set()).add(card.kind)
                if card.kind == JobKind.chat:
                    self._chat[name] = card
        self._read_at = time.monotonic()

    async def check(
        self, kind: JobKind, body: Any, limits: Limits = DEFAULT_LIMITS, *, stays_local: bool = False
    ) -> None:
        """Refuse ``body`` if the catalogue is known and does not serve its model for ``kind``.

        A body that is also invalid gets its 400 first, as OpenAI answers: the body is validated
        here only on the way to a refusal, so a served model pays nothing for it."""
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            return  # the body's own validation says what is wrong with it
        # Until a worker has published, look every time: the first jobs of a fresh deployment
        # get the catalogue's answer, not an empty one read just before its workers came up.
        if not self._cards or time.monotonic() - self._read_at >= self.ttl_s:
            await self._read()
        kind = JobKind(kind)
        if self._serves(kind, model):
            self._check_offers(kind, body, model, stays_local)
            return
        if time.monotonic() - self._read_at >= RECHECK_S:  # not read just now: look again
            await self._read()
            if self._serves(kind, model):
                self._check_offers(kind, body, model, stays_local)
                return
        parse_body(kind, body, limits)  # raises InvalidBody (400) for a body that is wrong too
        served = sorted(c.id for c in self._cards if c.kind == kind)
        raise NotFound(
            f"the model {model!r} is not served for {kind.value} requests (served: {', '.join(served)})",
            param="model",
            code="model_not_found",
        )

    def _serves(self, kind: JobKind, model: str) -> bool:
        if not self._cards:
            return True  # no worker has published a catalogue yet: accept, the worker decides
        return kind in self._kinds.get(model, ())

    def offered(self) -> frozenset[Capability]:
        """The features some chat model offers somewhere, in the catalogue last read."""
        return frozenset(
            cap for card in self._chat.values() for offers in card.offers.values() for cap in offers.features
        )

    def _check_offers(self, kind: JobKind, body: dict[str, Any], model: str, stays_local: bool) -> None:
        """Refuse a chat body needing what no place it may run offers (the worker's rule)."""
        card = self._chat.get(model) if kind == JobKind.chat else None
        if card is None or not card.offers:
            return  # an older worker's card, or no catalogue yet: the worker decides
        why = refusal(body, card.id, card.offers.get("local"), card.offers.get("remote"), stays_local)
        if why is not None:
            raise ApiError(why[0], param=why[1], code="model_lacks_capability")
