-- Write terminal results. KEYS: job1, done1, job2, done2, ...
-- ARGV: ttl, root, status1, result1, status2, result2, ...
-- Returns per job: 1 = written, 0 = was already terminal (left untouched).
local ttl = tonumber(ARGV[1])
local root = ARGV[2]
local out = {}
for i = 1, #KEYS / 2 do
  local key, done = KEYS[2 * i - 1], KEYS[2 * i]
  local s = redis.call('HGET', key, 'status')
  if s == 'queued' or s == 'running' then
    local envelope = ARGV[2 * i + 2]
    redis.call('HSET', key, 'status', ARGV[2 * i + 1], 'result', envelope)
    redis.call('EXPIRE', key, ttl)
    redis.call('RPUSH', done, '1')
    redis.call('EXPIRE', done, ttl)
    reply(key, root, envelope)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
