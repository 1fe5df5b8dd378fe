-- Start jobs of a chunk (see chunks.py). KEYS[1]: the chunk record. ARGV: job indices.
-- Returns per index: n > 0 = run it (its n-th attempt), 0 = already terminal, -1 = no such
-- record or job, -2 = the key is not a chunk record: left untouched.
local t = redis.call('TYPE', KEYS[1])['ok']
local n = nil
if t == 'hash' then n = tonumber(redis.call('HGET', KEYS[1], 'n')) end
local out = {}
for i, index in ipairs(ARGV) do
  local k = tonumber(index)
  if t == 'none' then
    out[i] = -1
  elseif not n then
    out[i] = -2
  elseif not k or k < 0 or k >= n then
    out[i] = -1
  elseif redis.call('HEXISTS', KEYS[1], 'r' .. index) == 1 then
    out[i] = 0
  else
    local a = redis.call('HGET', KEYS[1], 'a' .. index)
    if a and not tonumber(a) then
      out[i] = -2
    else
      out[i] = redis.call('HINCRBY', KEYS[1], 'a' .. index, 1)
    end
  end
end
return out
