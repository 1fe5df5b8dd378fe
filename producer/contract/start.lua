-- Start jobs of a package. KEYS: job keys.
-- Returns per key: n > 0 = run it (its n-th attempt), 0 = already terminal, -1 = record missing.
local out = {}
for i, key in ipairs(KEYS) do
  local s = redis.call('HGET', key, 'status')
  if not s then
    out[i] = -1
  elseif s == 'queued' or s == 'running' then
    redis.call('HSET', key, 'status', 'running')
    out[i] = redis.call('HINCRBY', key, 'attempts', 1)
  else
    out[i] = 0
  end
end
return out
