-- Write terminal results of jobs of a chunk. KEYS[1]: the chunk record.
-- ARGV: ttl, then index, envelope for each job. Field d counts the chunk's terminal jobs, so a
-- reader asks for envelopes only when it moved.
-- Returns per job: 1 = written, 0 = was already terminal (left untouched), -2 = the key is
-- not a chunk record (missing, or of another type): nothing written.
local out = {}
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'hash' or not redis.call('HGET', KEYS[1], 'n') then
  for j = 2, #ARGV, 2 do out[#out + 1] = -2 end
  return out
end
local written = 0
for j = 2, #ARGV, 2 do
  local ok = redis.call('HSETNX', KEYS[1], 'r' .. ARGV[j], ARGV[j + 1])
  out[#out + 1] = ok
  written = written + ok
end
local ttl = tonumber(ARGV[1])
if written > 0 then redis.call('HINCRBY', KEYS[1], 'd', written) end
if written > 0 and redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
return out
