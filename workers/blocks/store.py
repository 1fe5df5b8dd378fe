"""What a block needs of the worker's Redis side (``workers/jobs/store.py``'s JobStore has it):
named here so this room does not import the one above it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from producer.contract import JobResult, Lane, WorkItem


class BlockStore(Protocol):
    async def start_block(self, chunk_id: str, indices: Sequence[int]) -> tuple[list[int], int]: ...

    async def write_blocks(
        self, chunk_id: str, blocks: Sequence[tuple[int, bytes, Sequence[int]]]
    ) -> list[list[int]]: ...

    async def finish(self, results: Sequence[JobResult]) -> list[bool]: ...

    async def requeue(self, items: Sequence[WorkItem], lane: Lane, **how: Any) -> list[str]: ...
