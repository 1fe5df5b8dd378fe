"""A batch's progress: how many of its requests finished, ok or failed, and by which route.

Counted from a cursor on: one Lua call per page of entries reads each job's state where it
lives (its own record, or its chunk), so a pass costs a few calls however large the batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..contract import chunk_of
from .lines import Entry
from .state import LUA_ROUTES, LUA_STATES, PAGE, ROUTE_NAMES, BatchState
from .store import BatchStore


class ProgressCounter:
    def __init__(self, store: BatchStore) -> None:
        self.store = store
        self._states = store.redis.register_script(LUA_STATES)
        self._routes = store.redis.register_script(LUA_ROUTES)

    async def count(self, state: BatchState) -> BatchState:
        """Count finished requests: from the cursor on, one Lua call per page of entries."""
        cursor, ok, failed = state.scan_at, state.scan_ok, state.scan_failed
        tail_ok = tail_failed = 0
        advancing = True
        newly_ok: list[str] = []
        for start in range(state.scan_at, state.submitted, PAGE):
            entries = await self.store.entries(state.id, start, min(start + PAGE, state.submitted))
            codes = iter(await self._codes(entries))
            for entry in entries:
                code = next(codes) if entry.job_id else "F"
                if code == ".":
                    advancing = False
                elif advancing:
                    cursor += 1
                    ok += code == "S"
                    failed += code != "S"
                    if code == "S" and entry.job_id:
                        newly_ok.append(entry.job_id)
                else:
                    tail_ok += code == "S"
                    tail_failed += code != "S"
        routes = state.route_counts()
        for code in await self._route_codes(newly_ok):
            if code in ROUTE_NAMES:
                routes[ROUTE_NAMES[code]] += 1
        update = {
            "scan_at": cursor,
            "scan_ok": ok,
            "scan_failed": failed,
            "routes": json.dumps(routes),
            "completed": ok + tail_ok,
            "failed": failed + tail_failed,
        }
        await self.store.redis.hset(self.store.keys.batch(state.id), mapping=update)
        return state.model_copy(update={**update, "routes": json.dumps(routes)})

    def locate(self, job_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """Per job: the key holding its state and result, and '' (a record of its own) or its
        index in its chunk (the scripts' KEYS and ARGV)."""
        located = [chunk_of(job_id) for job_id in job_ids]
        return [self.store.keys.record(j) for j in job_ids], ["" if c is None else str(c[1]) for c in located]

    async def _codes(self, entries: Sequence[Entry]) -> str:
        keys, indices = self.locate([e.job_id for e in entries if e.job_id])
        return str(await self._states(keys=keys, args=indices)) if keys else ""

    async def _route_codes(self, job_ids: list[str]) -> str:
        out = []
        for start in range(0, len(job_ids), PAGE):
            keys, indices = self.locate(job_ids[start : start + PAGE])
            out.append(str(await self._routes(keys=keys, args=indices)))
        return "".join(out)
