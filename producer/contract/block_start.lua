-- Start jobs of a chunk that runs as a block (blocks.py). KEYS[1]: the chunk record. ARGV: job
-- indices. Returns chunk_start.lua's answer per index, then the first of the block numbers
-- reserved for this run (one per job started: a backend batch takes at least one), or 0 if
-- the chunk has too few left (the caller hands the jobs to the item path).
local out, started = start_jobs(KEYS[1], ARGV)
local first = 0
if started > 0 then
  local used = tonumber(redis.call('HGET', KEYS[1], 'nb')) or 0
  if used + started < IN_ENVELOPE then
    redis.call('HSET', KEYS[1], 'nb', used + started)
    first = used + 1
  end
end
out[#out + 1] = first
return out
