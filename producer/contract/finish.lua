-- Write terminal results. KEYS: job1, done1, job2, done2, ...
-- ARGV: ttl, root, status1, result1, status2, result2, ...
-- Returns per job: 1 = written, 0 = was already terminal (left untouched), -2 = its record or
-- done list is not of its type (a poisoned key): left untouched. A key of another type answers
-- with an error that pcall hands back as a value, before anything of its job is written, so
-- one poisoned job cannot stop its package-mates' results.
local ttl = tonumber(ARGV[1])
local root = ARGV[2]
local out = {}
for i = 1, #KEYS / 2 do
  local key, done = KEYS[2 * i - 1], KEYS[2 * i]
  local got = redis.pcall('HMGET', key, 'status', 'reply', 'stream')
  if got.err then
    out[i] = -2
  elseif got[1] ~= 'queued' and got[1] ~= 'running' then
    out[i] = got[1] and 0 or -2
  elseif type(redis.pcall('RPUSH', done, '1')) ~= 'number' then
    out[i] = -2
  else
    local envelope = ARGV[2 * i + 2]
    redis.call('HSET', key, 'status', ARGV[2 * i + 1], 'result', envelope)
    redis.call('EXPIRE', key, ttl)
    redis.call('EXPIRE', done, ttl)
    reply_later(key, root, envelope, got[2])
    stream_terminal(key, root, envelope, got[3])
    out[i] = 1
  end
end
push_replies()
return out
