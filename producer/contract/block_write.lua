-- Say where the rows of a result block are (blocks.py); the block itself, field b<k>, is written
-- by a plain HSET in the same round trip (a 100 KB block copied through a script cost Redis
-- 5.4 us a row, this HSET and script 1.5-1.9: python -m bench.chunk_scripts).
-- KEYS[1]: the chunk record. ARGV: ttl, the block's number k (reserved by block_start.lua),
-- then the chunk index of each of its rows.
-- Returns per row: 1 = written, 0 = the job was already terminal (its row is ignored), -1 = no
-- such job, -2 = the key is not a chunk record. A block none of whose rows counts is deleted.
local out = {}
local got = (redis.call('TYPE', KEYS[1])['ok'] == 'hash') and redis.call('HMGET', KEYS[1], 'n', 'x') or {}
local n = tonumber(got[1])
local k = tonumber(ARGV[2])
if not n then
  for j = 3, #ARGV do out[#out + 1] = -2 end
  return out
end
local marks, written = {}, 0
for j = 3, #ARGV do
  local i = tonumber(ARGV[j])
  if not i or i < 0 or i >= n then
    out[#out + 1] = -1
  elseif marks[i] or located(got[2], i) ~= 0 then
    out[#out + 1] = 0
  else
    marks[i] = k
    written = written + 1
    out[#out + 1] = 1
  end
end
if written > 0 then
  redis.call('HSET', KEYS[1], 'x', relocate(got[2], n, marks))
  redis.call('HINCRBY', KEYS[1], 'd', written)
  local ttl = tonumber(ARGV[1])
  if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
else
  redis.call('HDEL', KEYS[1], 'b' .. k)
end
return out
