-- Start jobs of a package. KEYS: job keys.
-- Returns per key: n > 0 = run it (its n-th attempt), 0 = already terminal, -1 = record missing,
-- -2 = not a job record (a key of another type, or fields no job has): left untouched.
-- Every key is checked before any is written, so the script applies to all its jobs or fails
-- for none: one poisoned key cannot leave a package-mate marked running.
local TERMINAL = {succeeded = true, failed = true, cancelled = true, expired = true}
local verdict = {}
for i, key in ipairs(KEYS) do
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then
    verdict[i] = -1
  elseif t ~= 'hash' then
    verdict[i] = -2
  else
    local s = redis.call('HGET', key, 'status')
    local attempts = redis.call('HGET', key, 'attempts')
    if not s then
      verdict[i] = -1
    elseif attempts and not tonumber(attempts) then
      verdict[i] = -2
    elseif s == 'queued' or s == 'running' then
      verdict[i] = 1
    elseif TERMINAL[s] then
      verdict[i] = 0
    else
      verdict[i] = -2
    end
  end
end
local out = {}
for i, key in ipairs(KEYS) do
  if verdict[i] == 1 then
    redis.call('HSET', key, 'status', 'running')
    out[i] = redis.call('HINCRBY', key, 'attempts', 1)
  else
    out[i] = verdict[i]
  end
end
return out
