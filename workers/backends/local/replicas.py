"""Several Triton replicas behind one backend: client-side balancing with failover.

``OVERSPILL_TRITON_URLS`` lists gRPC endpoints, comma-separated, each
``host:port[*weight][/primary|/backup]`` (weight 1, role primary by default), e.g.
``10.0.0.2:8001*3,10.0.0.3:8001*3,10.0.0.9:8001/backup``. A bare ``host:port`` is a list of one.

Per model, a request goes to the healthy primary with the fewest outstanding requests per unit
of weight. Backups serve only while no primary can, or while the model's overflow gate is open
(the router's saturation signals: ``overflowing``); then they join the primaries, balanced the
same way, and leave again when the gate closes. Each replica has its own circuit breaker,
fed by the readiness probe and by its calls. A call that fails for the replica's sake
(:class:`BackendUnavailable`: UNAVAILABLE, connection reset, deadline) trips that replica and
is sent to the next one, so an item fails for a replica's death only when no replica is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import tritonclient.grpc.aio as grpcclient
from prometheus_client import Counter, Gauge

from producer.contract import get_logger

from ...core.circuit import CircuitBreaker
from ...core.endpoints import Endpoint, Role
from ...core.errors import BackendUnavailable

log = get_logger(__name__)
T = TypeVar("T")

REPLICA_READY = Gauge(
    "overspill_triton_replica_ready", "1 while the replica answers the readiness probe", ["replica"]
)
REPLICA_OUTSTANDING = Gauge(
    "overspill_triton_replica_outstanding", "Triton requests in flight to the replica", ["replica", "model"]
)
REPLICA_REQUESTS = Counter(
    "overspill_triton_replica_requests_total",
    "Triton requests by replica and outcome",
    ["replica", "model", "outcome"],
)

# Triton's own signals per replica, read by workers.routing.signals (the replica is its metrics host:port).
REPLICA_PENDING = Gauge(
    "overspill_triton_pending_requests",
    "Triton's pending requests per replica and model",
    ["replica", "model"],
)
REPLICA_QUEUE_MS = Gauge(
    "overspill_triton_queue_ms_per_exec",
    "Triton queue time per execution (ms) per replica and model",
    ["replica", "model"],
)
REPLICA_GPU = Gauge("overspill_triton_gpu_utilization", "Triton GPU use (0-1) per replica", ["replica"])


@dataclass(eq=False)
class Replica:
    endpoint: Endpoint
    breaker: CircuitBreaker
    client: grpcclient.InferenceServerClient | None = None
    outstanding: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.endpoint.url

    def load(self, model: str) -> float:
        """Outstanding requests per unit of weight, counting the one about to be sent."""
        return (self.outstanding.get(model, 0) + 1) / self.endpoint.weight


# The tiers tried in turn: primaries, then backups; with the gate open, backups join the primaries.
_TIERS = (frozenset({Role.primary}), frozenset({Role.backup}))
_SATURATED = (frozenset({Role.primary, Role.backup}),)


def _never(model: str) -> bool:
    return False


class ReplicaSet:
    """The replicas of one worker, shared by every model's batcher."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        *,
        connect: bool = True,
        failures: int = 3,
        reset_after_s: float = 2.0,
        overflowing: Callable[[str], bool] | None = None,
    ) -> None:
        # Whether a Triton model's overflow gate is open; set by the dispatcher to the router's.
        self.overflowing: Callable[[str], bool] = overflowing or _never
        self.replicas = [
            Replica(
                e,
                CircuitBreaker(f"triton:{e.url}", failures=failures, reset_after_s=reset_after_s),
                grpcclient.InferenceServerClient(e.url) if connect else None,
            )
            for e in endpoints
        ]

    def pick(self, model: str, exclude: set[Replica] | frozenset[Replica] = frozenset()) -> Replica | None:
        """The replica to send ``model``'s next request to, or None when none may be tried."""
        tiers = _SATURATED if self.overflowing(model) else _TIERS
        for roles in tiers:
            tier = [r for r in self.replicas if r.endpoint.role in roles and r not in exclude]
            open_ = [r for r in tier if r.breaker.would_allow()]
            for replica in sorted(open_, key=lambda r: r.load(model)):
                if replica.breaker.allow():  # a half-open breaker lets one trial through
                    return replica
        return None

    async def call(self, model: str, send: Callable[[grpcclient.InferenceServerClient], Awaitable[T]]) -> T:
        """``send`` on the best replica; on a replica failure, on the next one, until none is left."""
        tried: set[Replica] = set()
        last: BackendUnavailable | None = None
        while (replica := self.pick(model, tried)) is not None:
            tried.add(replica)
            try:
                result = await self._send(replica, model, send)
            except BackendUnavailable as exc:
                last = exc
                replica.breaker.trip()
                REPLICA_REQUESTS.labels(replica.name, model, "unavailable").inc()
                log.warning(
                    "triton replica failed, trying another", replica=replica.name, model=model, error=str(exc)
                )
                continue
            replica.breaker.record_success()
            REPLICA_REQUESTS.labels(replica.name, model, "ok").inc()
            return result
        if last is not None:
            raise last
        raise BackendUnavailable(f"no Triton replica available for {model!r}")

    async def _send(
        self, replica: Replica, model: str, send: Callable[[grpcclient.InferenceServerClient], Awaitable[T]]
    ) -> T:
        assert replica.client is not None
        replica.outstanding[model] = replica.outstanding.get(model, 0) + 1
        REPLICA_OUTSTANDING.labels(replica.name, model).set(replica.outstanding[model])
        try:
            return await send(replica.client)
        finally:
            replica.outstanding[model] -= 1
            REPLICA_OUTSTANDING.labels(replica.name, model).set(replica.outstanding[model])

    async def probe(self, timeout_s: float = 2.0) -> dict[str, bool]:
        """Ask every replica whether it is ready, feeding each breaker; replica name -> ready."""
        answers = await asyncio.gather(*(self._ready(r, timeout_s) for r in self.replicas))
        for replica, ok in zip(self.replicas, answers, strict=True):
            replica.breaker.probe(ok)
            REPLICA_READY.labels(replica.name).set(1 if ok else 0)
        return {r.name: ok for r, ok in zip(self.replicas, answers, strict=True)}

    @staticmethod
    async def _ready(replica: Replica, timeout_s: float) -> bool:
        if replica.client is None:
            return False
        try:
            return bool(await replica.client.is_server_ready(client_timeout=timeout_s))
        except Exception:
            return False

    async def aclose(self) -> None:
        await asyncio.gather(*(r.client.close() for r in self.replicas if r.client is not None))
