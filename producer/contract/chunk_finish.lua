-- Write terminal envelopes of jobs of a chunk. KEYS[1]: the chunk record.
-- ARGV: ttl, then index, envelope for each job. Field d counts the chunk's terminal jobs, so a
-- reader asks for results only when it moved; field x says where each job's result is.
-- Returns per job: 1 = written, 0 = was already terminal (left untouched), -2 = the key is
-- not a chunk record (missing, or of another type): nothing written.
local out = {}
local t = redis.call('TYPE', KEYS[1])['ok']
local got = (t == 'hash') and redis.call('HMGET', KEYS[1], 'n', 'x') or {}
local n = tonumber(got[1])
if not n then
  for j = 2, #ARGV, 2 do out[#out + 1] = -2 end
  return out
end
local marks = {}  -- indices written by this call (an index may come twice: the first wins)
local writes = {}
for j = 2, #ARGV, 2 do
  local i = tonumber(ARGV[j])
  if not i or i < 0 or i >= n or marks[i] or located(got[2], i) ~= 0 then
    out[#out + 1] = 0
  else
    marks[i] = IN_ENVELOPE
    writes[#writes + 1] = 'r' .. ARGV[j]
    writes[#writes + 1] = ARGV[j + 1]
    out[#out + 1] = 1
  end
end
local ttl = tonumber(ARGV[1])
if #writes > 0 then
  writes[#writes + 1] = 'x'
  writes[#writes + 1] = relocate(got[2], n, marks)
  hset(KEYS[1], writes)
  redis.call('HINCRBY', KEYS[1], 'd', (#writes - 2) / 2)
  if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
end
return out
