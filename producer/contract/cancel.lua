-- Cancel a queued job. KEYS: job, done. ARGV: tenant, result (cancelled envelope), ttl, root.
-- Returns 1 = cancelled, 0 = already terminal, 2 = running (cannot cancel), -1 = not found.
-- A key that is not a job record (or a done key that is not a list) is not a job: -1.
local d = redis.call('TYPE', KEYS[2])['ok']
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' or (d ~= 'none' and d ~= 'list') then return -1 end
local s = redis.call('HGET', KEYS[1], 'status')
if not s or redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return -1 end
if s == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'result', ARGV[2])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
  redis.call('RPUSH', KEYS[2], '1')
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
  reply(KEYS[1], ARGV[4], ARGV[2])
  stream_terminal(KEYS[1], ARGV[4], ARGV[2])
  return 1
end
if s == 'running' then return 2 end
return 0
