-- Write terminal results of jobs of a chunk. KEYS[1]: the chunk record.
-- ARGV: ttl, then index, envelope for each job. Field d counts the chunk's terminal jobs, so a
-- reader asks for envelopes only when it moved.
-- Returns per job: 1 = written, 0 = was already terminal (left untouched), -2 = the key is
-- not a chunk record (missing, or of another type): nothing written.
-- One HMGET finds the jobs already terminal and one HSET writes the rest: a few commands per
-- call whatever its size, where a field test per job cost a command each.
local out = {}
local t = redis.call('TYPE', KEYS[1])['ok']
local fields = {'n'}
for j = 2, #ARGV, 2 do fields[#fields + 1] = 'r' .. ARGV[j] end
local got = (t == 'hash') and hmget(KEYS[1], fields) or {}
if not got[1] then
  for j = 2, #ARGV, 2 do out[#out + 1] = -2 end
  return out
end
local taken = {}  -- indices written by this call (an index may come twice: the first wins)
local writes = {}
for j = 2, #ARGV, 2 do
  local index = ARGV[j]
  if got[j / 2 + 1] or taken[index] then
    out[#out + 1] = 0
  else
    taken[index] = true
    writes[#writes + 1] = 'r' .. index
    writes[#writes + 1] = ARGV[j + 1]
    out[#out + 1] = 1
  end
end
local ttl = tonumber(ARGV[1])
if #writes > 0 then
  hset(KEYS[1], writes)
  redis.call('HINCRBY', KEYS[1], 'd', #writes / 2)
  if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
end
return out
