"""``python -m bench.chunk_scripts``: what the block scripts cost Redis, beside the shapes they replaced.

On a redis-server of its own (free port, temp dir), ``--chunks`` chunks of 256 jobs each: its
Redis command time (``INFO commandstats``, microseconds) for

- starting a chunk's jobs: ``block_start.lua`` (attempts in one field of a byte per job) against a
  script that writes a field per job, as the chunk scripts did;
- writing a 64-row block of 384 floats (about 100 KB): a plain ``HSET`` beside ``block_write.lua``
  against the same value passed through a script's ``HSET``.

Prints one JSON line; the figures are quoted in ``producer/contract/locations.lua`` and
``block_write.lua``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from producer.contract import LUA_BLOCK_START, LUA_BLOCK_WRITE, BlockHead, connect, pack_block
from stack.processes import free_port, redis_process

JOBS = 256
ROWS = 64
# The former shapes, for comparison: attempts as a field per job; a block copied through Lua.
FIELD_PER_JOB = """
local t = {}
for _, i in ipairs(ARGV) do t[#t + 1] = 'a' .. i; t[#t + 1] = 1 end
redis.call('HSET', KEYS[1], unpack(t))
return #ARGV
"""
THROUGH_LUA = "redis.call('HSET', KEYS[1], 'b' .. ARGV[1], ARGV[2]) return 1"


async def command_us(redis: Any) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["usec"]) for k, v in stats.items() if k != "cmdstat_info")


async def measure(redis: Any, chunks: int) -> dict[str, float]:
    scripts = {
        name: redis.register_script(src)
        for name, src in (
            ("block_start", LUA_BLOCK_START),
            ("block_write", LUA_BLOCK_WRITE),
            ("field_per_job", FIELD_PER_JOB),
            ("through_lua", THROUGH_LUA),
        )
    }
    spent = dict.fromkeys(
        ("start_one_field", "start_field_per_job", "block_plain_hset", "block_through_lua"), 0
    )
    head = BlockHead("embed", "m", "local", None, "float", time.time(), time.time(), 1.0, 1.0, ROWS, 1)
    for c in range(chunks):
        for variant in ("start_one_field", "start_field_per_job"):
            key = f"bench-chunk:{variant}:{c}"
            await redis.hset(key, mapping={"n": JOBS})
            before = await command_us(redis)
            script = scripts["block_start" if variant == "start_one_field" else "field_per_job"]
            await script(keys=[key], args=list(range(JOBS)))
            spent[variant] += await command_us(redis) - before
        key = f"bench-chunk:start_one_field:{c}"
        for b in range(JOBS // ROWS):
            indices = np.arange(b * ROWS, (b + 1) * ROWS)
            blob = pack_block(head, indices, indices, np.random.rand(ROWS, 384).astype(np.float32))
            before = await command_us(redis)
            async with redis.pipeline(transaction=False) as pipe:
                pipe.hset(key, f"b{b + 1}", blob)
                args = [60, b + 1, ROWS, *indices.tolist()]
                await scripts["block_write"](keys=[key], args=args, client=pipe)
                await pipe.execute()
            middle = await command_us(redis)
            await scripts["through_lua"](keys=[f"{key}:copy"], args=[b + 1, blob])
            spent["block_plain_hset"] += middle - before
            spent["block_through_lua"] += await command_us(redis) - middle
    return {
        "start_us_per_job_one_field": round(spent["start_one_field"] / chunks / JOBS, 2),
        "start_us_per_job_field_each": round(spent["start_field_per_job"] / chunks / JOBS, 2),
        "block_us_per_row_plain_hset_and_map": round(spent["block_plain_hset"] / chunks / JOBS, 2),
        "block_us_per_row_through_lua_value_only": round(spent["block_through_lua"] / chunks / JOBS, 2),
    }


async def main(chunks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-chunk-scripts-") as tmp:
        port = free_port()
        server = redis_process(port, Path(tmp), appendonly=False).start()
        redis = connect(f"redis://127.0.0.1:{port}/0")
        try:
            return {"chunks": chunks, "jobs_per_chunk": JOBS, **await measure(redis, chunks)}
        finally:
            await redis.aclose()
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.chunk_scripts", description=__doc__)
    parser.add_argument("--chunks", type=int, default=40)
    print(json.dumps(asyncio.run(main(parser.parse_args().chunks))))
