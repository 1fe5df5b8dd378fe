-- Say where the rows of result blocks are (blocks.py); the blocks themselves, fields b<k>, are
-- written by one plain HSET in the same round trip (a 100 KB block copied through a script cost
-- Redis 5.4 us a row, this HSET and script 1.5-1.9: python -m bench.chunk_scripts).
-- KEYS[1]: the chunk record. ARGV: ttl, then for each block: its number k (reserved by
-- block_start.lua), its row count m, and the chunk index of each of its m rows.
-- Returns per block, per row: 1 = written, 0 = the job was already terminal (its row is
-- ignored), -1 = no such job, -2 = the key is not a chunk record. A block none of whose rows
-- counts is deleted.
local out = {}
local got = (redis.call('TYPE', KEYS[1])['ok'] == 'hash') and redis.call('HMGET', KEYS[1], 'n', 'x') or {}
local n = tonumber(got[1])
local marks, written, unused = {}, 0, {}
local j = 2
while j < #ARGV do
  local k, m = tonumber(ARGV[j]), tonumber(ARGV[j + 1])
  local flags, counted = {}, 0
  for r = j + 2, j + 1 + m do
    local i = tonumber(ARGV[r])
    if not n then
      flags[#flags + 1] = -2
    elseif not i or i < 0 or i >= n then
      flags[#flags + 1] = -1
    elseif marks[i] or located(got[2], i) ~= 0 then
      flags[#flags + 1] = 0
    else
      marks[i] = k
      counted = counted + 1
      flags[#flags + 1] = 1
    end
  end
  if counted == 0 and n then unused[#unused + 1] = 'b' .. k end
  written = written + counted
  out[#out + 1] = flags
  j = j + 2 + m
end
if written > 0 then
  redis.call('HSET', KEYS[1], 'x', relocate(got[2], n, marks))
  redis.call('HINCRBY', KEYS[1], 'd', written)
  local ttl = tonumber(ARGV[1])
  if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
end
if #unused > 0 then redis.call('HDEL', KEYS[1], unpack(unused)) end
return out
