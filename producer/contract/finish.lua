-- Write terminal results. KEYS: job1, done1, job2, done2, ...
-- ARGV: ttl, root, status1, result1, status2, result2, ...
-- Returns per job: 1 = written, 0 = was already terminal (left untouched), -2 = its record or
-- done list is not of its type (a poisoned key): left untouched. Checked before any write, so
-- one poisoned job cannot stop its package-mates' results.
local ttl = tonumber(ARGV[1])
local root = ARGV[2]
local writable = {}
for i = 1, #KEYS / 2 do
  local key, done = KEYS[2 * i - 1], KEYS[2 * i]
  local t, d = redis.call('TYPE', key)['ok'], redis.call('TYPE', done)['ok']
  if t ~= 'hash' or (d ~= 'none' and d ~= 'list') then
    writable[i] = -2
  else
    local s = redis.call('HGET', key, 'status')
    writable[i] = (s == 'queued' or s == 'running') and 1 or 0
  end
end
local out = {}
for i = 1, #KEYS / 2 do
  local key, done = KEYS[2 * i - 1], KEYS[2 * i]
  if writable[i] == 1 then
    local envelope = ARGV[2 * i + 2]
    redis.call('HSET', key, 'status', ARGV[2 * i + 1], 'result', envelope)
    redis.call('EXPIRE', key, ttl)
    redis.call('RPUSH', done, '1')
    redis.call('EXPIRE', done, ttl)
    reply(key, root, envelope)
    stream_terminal(key, root, envelope)
  end
  out[i] = writable[i]
end
return out
