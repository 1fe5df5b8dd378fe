-- Start jobs of a package. KEYS: job keys.
-- Returns per key: n > 0 = run it (its n-th attempt), 0 = already terminal, -1 = record missing,
-- -2 = not a job record (a key of another type, or fields no job has): left untouched.
-- Every key is checked before any is written, so the script applies to all its jobs or fails
-- for none: one poisoned key cannot leave a package-mate marked running. Two commands a job:
-- a key of another type answers HMGET with an error, which pcall hands back as a value.
local TERMINAL = {succeeded = true, failed = true, cancelled = true, expired = true}
local verdict, attempt = {}, {}
for i, key in ipairs(KEYS) do
  local got = redis.pcall('HMGET', key, 'status', 'attempts')
  if got.err then
    verdict[i] = -2
  else
    local s, attempts = got[1], got[2]
    if not s then
      verdict[i] = -1
    elseif attempts and not tonumber(attempts) then
      verdict[i] = -2
    elseif s == 'queued' or s == 'running' then
      verdict[i] = 1
      attempt[i] = (tonumber(attempts) or 0) + 1
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
    redis.call('HSET', key, 'status', 'running', 'attempts', attempt[i])
    out[i] = attempt[i]
  else
    out[i] = verdict[i]
  end
end
return out
