-- Write one result block of a chunk (blocks.py). KEYS[1]: the chunk record. ARGV: ttl, the
-- block's bytes, then the chunk index of each of its rows.
-- Returns per row: 1 = written, 0 = the job was already terminal (its row is ignored), -1 = no
-- such job, -2 = the key is not a chunk record (nothing written), -3 = the chunk has used every
-- block number (nothing written: the caller writes those jobs as envelopes).
local out = {}
local t = redis.call('TYPE', KEYS[1])['ok']
local got = (t == 'hash') and redis.call('HMGET', KEYS[1], 'n', 'x', 'nb') or {}
local n = tonumber(got[1])
local k = (tonumber(got[3]) or 0) + 1
if not n or k >= IN_ENVELOPE then
  for j = 3, #ARGV do out[#out + 1] = n and -3 or -2 end
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
  redis.call('HSET', KEYS[1], 'b' .. k, ARGV[2], 'x', relocate(got[2], n, marks), 'nb', k)
  redis.call('HINCRBY', KEYS[1], 'd', written)
  local ttl = tonumber(ARGV[1])
  if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
end
return out
