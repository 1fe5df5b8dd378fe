"""The job state machine as Lua scripts, kept as ``*.lua`` files beside this module.

Scripts keep each transition atomic: a job reaches exactly one terminal state, whoever races
(a cancelling producer, a re-run after a killed worker, a duplicate delivery). Each file is
read once, at import.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from .streams import STREAM_DONE_TTL_S, STREAM_MAXLEN

__all__ = [
    "LUA_BLOCK_START",
    "LUA_BLOCK_WRITE",
    "LUA_CANCEL",
    "LUA_CHUNK_CANCEL",
    "LUA_CHUNK_FINISH",
    "LUA_CHUNK_START",
    "LUA_COLLECT",
    "LUA_FAIR_CLAIM",
    "LUA_FAIR_ENQUEUE",
    "LUA_FINISH",
    "LUA_LOCATIONS",
    "LUA_START",
    "LUA_SUBMIT",
    "REPLY_MAX",
    "REPLY_TTL_S",
    "SUBMIT_FIELDS",
]

_HERE = Path(__file__).parent

# Reply lists (see producer/client/replies.py): how long an unread one lives, how long it grows.
REPLY_TTL_S = 300
REPLY_MAX = 100_000
SUBMIT_FIELDS = 7  # ARGV entries per job in submit.lua
# Items claimed per tenant are counted in slices of this length (contract/fairness.py).
SLICE_MS = 10_000
SLICE_TTL_S = 120
UNLINED = "~unlined"  # the tenant a package found by the fair claim's sweep is counted under


def _lua(name: str) -> str:
    text = (_HERE / f"{name}.lua").read_text()
    return Template(text).substitute(
        REPLY_MAX=REPLY_MAX,
        REPLY_TTL_S=REPLY_TTL_S,
        STREAM_MAXLEN=STREAM_MAXLEN,
        STREAM_DONE_TTL_S=STREAM_DONE_TTL_S,
        SLICE_MS=SLICE_MS,
        SLICE_TTL_S=SLICE_TTL_S,
        UNLINED=UNLINED,
    )


LUA_SUBMIT = _lua("submit")
LUA_START = _lua("start")
LUA_FINISH = _lua("reply") + _lua("streamed") + _lua("finish")
LUA_CANCEL = _lua("reply") + _lua("streamed") + _lua("cancel")
LUA_COLLECT = _lua("collect")
# Jobs of a bulk chunk (chunks.py): fields of one record, so no reply list, stream or done list.
LUA_CHUNK_START = _lua("locations") + _lua("chunk_start")
LUA_BLOCK_START = _lua("locations") + _lua("block_start")
LUA_CHUNK_FINISH = _lua("hash_slices") + _lua("locations") + _lua("chunk_finish")
LUA_CHUNK_CANCEL = _lua("hash_slices") + _lua("locations") + _lua("chunk_cancel")
LUA_BLOCK_WRITE = _lua("locations") + _lua("block_write")
LUA_LOCATIONS = _lua("locations")  # for other readers of chunk records (producer/batches/state.py)
# Fair share between tenants within a lane (fairness.py).
LUA_FAIR_ENQUEUE = _lua("fair_enqueue")
LUA_FAIR_CLAIM = _lua("fair_claim")
