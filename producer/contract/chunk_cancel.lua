-- Cancel queued jobs of a chunk. KEYS[1]: the chunk record. ARGV: tenant, ttl, then index,
-- envelope (the cancelled one) for each job.
-- Returns per job: 1 = cancelled, 0 = already terminal, 2 = running (cannot cancel),
-- -1 = not found (no such record or job, another tenant's, or not a chunk record).
local out = {}
local ok = redis.call('TYPE', KEYS[1])['ok'] == 'hash'
local f = ok and redis.call('HMGET', KEYS[1], 'tenant', 'n', 'x', 'y') or {}
local n = tonumber(f[2])
local marks, writes, cancelled = {}, {}, 0
for j = 3, #ARGV, 2 do
  local k = tonumber(ARGV[j])
  if not n or f[1] ~= ARGV[1] or not k or k < 0 or k >= n then
    out[#out + 1] = -1
  elseif marks[k] or located(f[3], k) ~= 0 then
    out[#out + 1] = 0
  elseif attempts_of(f[4], k) > 0 then
    out[#out + 1] = 2
  else
    marks[k] = IN_ENVELOPE
    writes[#writes + 1] = 'r' .. ARGV[j]
    writes[#writes + 1] = ARGV[j + 1]
    out[#out + 1] = 1
    cancelled = cancelled + 1
  end
end
local ttl = tonumber(ARGV[2])
if cancelled > 0 then
  writes[#writes + 1] = 'x'
  writes[#writes + 1] = relocate(f[3], n, marks)
  hset(KEYS[1], writes)
  redis.call('HINCRBY', KEYS[1], 'd', cancelled)
  if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
end
return out
