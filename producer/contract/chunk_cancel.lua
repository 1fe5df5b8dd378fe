-- Cancel queued jobs of a chunk. KEYS[1]: the chunk record. ARGV: tenant, ttl, then index,
-- envelope (the cancelled one) for each job.
-- Returns per job: 1 = cancelled, 0 = already terminal, 2 = running (cannot cancel),
-- -1 = not found (no such record or job, another tenant's, or not a chunk record).
local out = {}
local ok = redis.call('TYPE', KEYS[1])['ok'] == 'hash'
local f = ok and redis.call('HMGET', KEYS[1], 'tenant', 'n') or {}
local n = tonumber(f[2])
local cancelled = 0
for j = 3, #ARGV, 2 do
  local k = tonumber(ARGV[j])
  if not n or f[1] ~= ARGV[1] or not k or k < 0 or k >= n then
    out[#out + 1] = -1
  elseif redis.call('HEXISTS', KEYS[1], 'r' .. ARGV[j]) == 1 then
    out[#out + 1] = 0
  elseif redis.call('HEXISTS', KEYS[1], 'a' .. ARGV[j]) == 1 then
    out[#out + 1] = 2
  else
    redis.call('HSET', KEYS[1], 'r' .. ARGV[j], ARGV[j + 1])
    out[#out + 1] = 1
    cancelled = cancelled + 1
  end
end
local ttl = tonumber(ARGV[2])
if cancelled > 0 then redis.call('HINCRBY', KEYS[1], 'd', cancelled) end
if cancelled > 0 and redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
return out
