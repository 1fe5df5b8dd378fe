"""Where a streamed chat job may run, in order: its route first, then where it may fail over to
before its first token. Each :class:`Source` books its outcome with the :class:`Decider`
(circuits, a remote's gaps) and local load, as the batch path does."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from producer.contract import Route, RouteReason, WorkItem

from ..backends.base import ChatDelta, ChatStreamer
from ..core.errors import BackendUnavailable, RemoteLacks, RemoteUnavailable
from ..core.settings import ModelSpec
from ..streaming.chat import Source, close_stream
from .decide import Decider


async def _accounted(it: AsyncIterator[ChatDelta], end: Callable[[bool], None]) -> AsyncIterator[ChatDelta]:
    """``it``, with ``end(started)`` called once it is over (the router's view of local load)."""
    started = False
    try:
        async for delta in it:
            started = True
            yield delta
    finally:
        end(started)
        await close_stream(it)


def local_source(
    decider: Decider, triton: ChatStreamer, item: WorkItem, spec: ModelSpec, reason: RouteReason
) -> Source:
    """Triton, with the decider's load accounting and circuit."""
    load, circuit = decider.load, decider.triton_circuit

    def open_(messages: str, params: str) -> AsyncIterator[ChatDelta]:
        token = load.begin(spec.name, 1, item.lane)
        it = triton.chat_stream(spec.triton_model, messages, params)
        return _accounted(it, lambda started: load.end(spec.name, token, done=started))

    def failed(exc: Exception) -> None:
        if isinstance(exc, BackendUnavailable):
            circuit.record_failure()

    return Source(Route.local, reason, spec.name, open_, failed, circuit.record_success)


def remote_sources(decider: Decider, item: WorkItem, spec: ModelSpec, reason: RouteReason) -> list[Source]:
    """Each remote that may take the job now, in the pool's order of fallback."""
    if decider.remote is None or item.local_only:
        return []
    out = []
    for provider in decider.remote.candidates(spec, item):

        def failed(exc: Exception, p: Any = provider) -> None:
            if isinstance(exc, RemoteLacks):
                p.lacks(spec)
            elif isinstance(exc, RemoteUnavailable):
                p.circuit.record_failure()
            decider.remote_failed(exc, spec)

        def succeeded(p: Any = provider) -> None:
            p.circuit.record_success()
            decider.remote_circuit.record_success()

        handlers = provider.handlers
        model = provider.config.remote_model(spec.name)
        out.append(
            Source(
                Route.remote,
                reason,
                handlers.reported_model(spec),
                lambda m, p, b=handlers.backend, n=model: b.chat_stream(n, m, p),
                failed,
                succeeded,
                {"provider": provider.name},
            )
        )
    return out


def stream_sources(
    decider: Decider, triton: ChatStreamer, item: WorkItem, spec: ModelSpec, route: Route, reason: RouteReason
) -> list[Source]:
    """The sources of a streamed job decided to run on ``route`` for ``reason``."""
    if route == Route.remote:
        remote = remote_sources(decider, item, spec, reason)
        return (
            remote
            if spec.remote_only or reason == RouteReason.capability
            else [*remote, local_source(decider, triton, item, spec, RouteReason.failover)]
        )
    local = [local_source(decider, triton, item, spec, reason)]
    if decider.may_fail_over(item, spec):
        return [*local, *remote_sources(decider, item, spec, RouteReason.failover)]
    return local


__all__ = ["local_source", "remote_sources", "stream_sources"]
