-- Cancel a queued job. KEYS: job, done. ARGV: tenant, result (cancelled envelope), ttl, root.
-- Returns 1 = cancelled, 0 = already terminal, 2 = running (cannot cancel), -1 = not found.
-- A key that is not a job record (or a done key that is not a list) is not a job: -1.
local got = redis.pcall('HMGET', KEYS[1], 'status', 'tenant', 'reply', 'stream')
if got.err or not got[1] or got[2] ~= ARGV[1] then return -1 end
local s = got[1]
if s == 'queued' then
  if type(redis.pcall('RPUSH', KEYS[2], '1')) ~= 'number' then return -1 end
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'result', ARGV[2])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
  reply(KEYS[1], ARGV[4], ARGV[2], got[3])
  stream_terminal(KEYS[1], ARGV[4], ARGV[2], got[4])
  return 1
end
if s == 'running' then return 2 end
return 0
