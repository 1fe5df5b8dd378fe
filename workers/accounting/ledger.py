"""The usage ledger: per tenant × model × route × day, what jobs used and what it cost.

Each settled job adds its requests, items, prompt and completion tokens (from its result's
``usage``, so the ledger sums to what the envelopes say), its share of local GPU time (each
Triton execution's time split by its items) and its cost: remote tokens at the providers
file's prices, local GPU-seconds at the local replica's hourly price, cache hits free.
A job cost-aware routing kept local (``route_reason: cost_local_fits_deadline``) also books
``saved``: what the remote it would have spilled to would have charged for its tokens.
Totals gather in memory and go to Redis once a second in one pipeline, so the hot path pays
no round trip; a crash loses at most that second. Layout: ``producer/contract/usage.py``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from producer.contract import (
    MEASURES,
    USAGE_TTL_S,
    JobKind,
    Keys,
    Route,
    RouteReason,
    WorkItem,
    day_of,
    get_logger,
    month_of,
    usage_field,
)

from ..backends.base import Answer
from ..backends.remote.providers_file import LocalPrice, Price
from ..core.metrics import USAGE_COST, USAGE_TOKENS
from ..core.periodic import Periodic
from ..core.settings import ModelSpec

log = get_logger(__name__)

FLUSH_S = 1.0
SERIES_CACHE = 4096  # (tenant, model, route) series kept formatted; past it, the cache restarts
# A series' ledger fields by measure, and its prompt-token, completion-token and cost counters.
_Series = tuple[dict[str, str], Any, Any, Any]


def items_of(item: WorkItem) -> int:
    """The inputs a job carries: texts for embeddings, documents for rerank, one chat."""
    if item.kind == JobKind.embed:
        inputs = item.body.get("input")
        return len(inputs) if isinstance(inputs, list) else 1
    if item.kind == JobKind.rerank:
        return len(item.body.get("documents") or [])
    return 1


def tokens_of(body: dict[str, Any] | None) -> tuple[int, int]:
    """(prompt, completion) tokens from a result body's ``usage``."""
    usage = (body or {}).get("usage") or {}
    completion = int(usage.get("completion_tokens") or 0)
    prompt = usage.get("prompt_tokens")
    if prompt is None:
        prompt = int(usage.get("total_tokens") or 0) - completion
    return int(prompt), completion


def gpu_share_s(answer: Answer, items: int) -> float:
    """This job's share of the Triton executions that carried it."""
    if answer.batch_size <= 0:
        return 0.0
    return answer.infer_ms / 1000 * min(items, answer.batch_size) / answer.batch_size


class Ledger:
    def __init__(
        self,
        redis: Any,
        keys: Keys,
        price_of: Any,  # (provider or None for the first that prices it, model) -> Price | None
        local_price: LocalPrice,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._price_of = price_of
        self._local = local_price
        self._pending: dict[tuple[str, str], float] = defaultdict(float)  # (day, field) → amount
        self._series_cache: dict[tuple[str, str, str], _Series] = {}
        self._task = Periodic("usage ledger flush", self.flush, FLUSH_S, at_once=False)

    def start(self) -> None:
        self._task.start()

    def record(
        self,
        item: WorkItem,
        spec: ModelSpec | None,
        answer: Answer,
        route: Route,
        reason: RouteReason | None = None,
    ) -> None:
        model = spec.name if spec is not None else str(item.body.get("model", "?"))
        items = items_of(item)
        prompt, completion = tokens_of(answer.body)
        gpu_s = gpu_share_s(answer, items) if route == Route.local else 0.0
        cost = self.cost(route, model, answer, prompt, completion, gpu_s)
        # What the what-if report compares with: the same tokens at the remote's price.
        listed = self._price_of(None, model)
        remote_cost = cost if route == Route.remote else listed.cost(prompt, completion) if listed else 0.0
        saved = remote_cost if reason == RouteReason.cost_local else 0.0  # the remote's bill it avoided
        self._book(item.tenant, model, route, (1, items, prompt, completion, gpu_s, cost, remote_cost, saved))

    def record_rows(
        self,
        tenant: str,
        model: str,
        jobs: int,
        items: int,
        tokens: tuple[int, int],
        gpu_s: float,
        reason: RouteReason | None,
    ) -> None:
        """The jobs one backend batch finished for a block (``workers/blocks/``), run locally,
        booked together: ``items`` inputs, ``tokens`` (prompt, completion) between them."""
        prompt, completion = tokens
        cost = gpu_s * self._local.replica_per_hour / 3600
        listed = self._price_of(None, model)
        remote_cost = listed.cost(prompt, completion) if listed else 0.0
        saved = remote_cost if reason == RouteReason.cost_local else 0.0
        amounts = (jobs, items, prompt, completion, gpu_s, cost, remote_cost, saved)
        self._book(tenant, model, Route.local, amounts)

    def _book(self, tenant: str, model: str, route: Route, amounts: tuple[float, ...]) -> None:
        """Add ``amounts`` (one per measure, in ``MEASURES`` order) to the day's totals."""
        day = day_of(time.time())
        fields, prompt_tokens, completion_tokens, spent = self._series(tenant, model, route.value)
        for measure, amount in zip(MEASURES, amounts, strict=True):
            if amount:
                self._pending[(day, fields[measure])] += amount
        _, _, prompt, completion, _, cost, _, _ = amounts
        if prompt:
            prompt_tokens.inc(prompt)
        if completion:
            completion_tokens.inc(completion)
        if cost:
            spent.inc(cost)
        if route == Route.remote and cost:
            self._pending[(month_of(time.time()), tenant)] += cost  # the budgets' running total

    def _series(self, tenant: str, model: str, route: str) -> _Series:
        """The ledger fields and metric children of one (tenant, model, route), made once:
        formatting them per result cost more than recording it."""
        key = (tenant, model, route)
        series = self._series_cache.get(key)
        if series is None:
            if len(self._series_cache) >= SERIES_CACHE:
                self._series_cache.clear()
            fields = {m: usage_field(tenant, model, route, m) for m in MEASURES}
            series = self._series_cache[key] = (
                fields,
                USAGE_TOKENS.labels(tenant, model, route, "prompt"),
                USAGE_TOKENS.labels(tenant, model, route, "completion"),
                USAGE_COST.labels(tenant, route),
            )
        return series

    def cost(
        self, route: Route, model: str, answer: Answer, prompt: int, completion: int, gpu_s: float
    ) -> float:
        if route == Route.local:
            return gpu_s * self._local.replica_per_hour / 3600
        if route == Route.remote:
            price: Price | None = self._price_of(answer.extra.get("provider", ""), model)
            return price.cost(prompt, completion) if price is not None else 0.0
        return 0.0

    async def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, defaultdict(float)
        pipe = self._redis.pipeline(transaction=False)
        for (when, field), amount in pending.items():
            pipe.hincrbyfloat(self._key(when), field, amount)
        for when in {when for when, _ in pending}:
            pipe.expire(self._key(when), USAGE_TTL_S)
        try:
            await pipe.execute()
        except Exception as exc:  # Redis away: keep the totals for the next flush
            for key, amount in pending.items():
                self._pending[key] += amount
            log.warning("usage ledger flush failed; kept for the next one", error=repr(exc)[:200])

    def _key(self, when: str) -> str:
        """A day's ledger (YYYY-MM-DD) or a month's remote spend (YYYY-MM)."""
        return self._keys.usage(when) if len(when) == 10 else self._keys.remote_spend(when)

    def unflushed_spend(self, tenant: str) -> float:
        """Remote cost booked here and not yet in Redis (this month)."""
        return self._pending.get((month_of(time.time()), tenant), 0.0)

    async def aclose(self) -> None:
        await self._task.aclose()
        await self.flush()
