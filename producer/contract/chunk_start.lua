-- Start jobs of a chunk (see chunks.py). KEYS[1]: the chunk record. ARGV: job indices.
-- Returns per index: n > 0 = run it (its n-th attempt), 0 = already terminal, -1 = no such
-- record or job, -2 = the key is not a chunk record: left untouched.
local out = start_jobs(KEYS[1], ARGV)
return out
