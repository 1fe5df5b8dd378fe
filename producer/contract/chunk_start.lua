-- Start jobs of a chunk (see chunks.py). KEYS[1]: the chunk record. ARGV: job indices.
-- Returns per index: n > 0 = run it (its n-th attempt), 0 = already terminal, -1 = no such
-- record or job, -2 = the key is not a chunk record: left untouched.
-- A call reads its jobs' fields in one HMGET and writes their attempts in one HSET: a few
-- commands per call, not three per job (Redis runs every command of a script on its thread).
local t = redis.call('TYPE', KEYS[1])['ok']
local out = {}
if t ~= 'hash' then
  for i = 1, #ARGV do out[i] = (t == 'none') and -1 or -2 end
  return out
end
local fields = {'n', 'x'}
for _, index in ipairs(ARGV) do fields[#fields + 1] = 'a' .. index end
local got = hmget(KEYS[1], fields)
local n = tonumber(got[1])
local attempts = {}  -- index -> attempts after this call (an index may come twice)
local writes = {}
for i, index in ipairs(ARGV) do
  local k = tonumber(index)
  local a = got[i + 2]
  if not n then
    out[i] = -2
  elseif not k or k < 0 or k >= n then
    out[i] = -1
  elseif located(got[2], k) ~= 0 then
    out[i] = 0
  elseif a and not tonumber(a) then
    out[i] = -2
  else
    local now = (attempts[index] or tonumber(a) or 0) + 1
    attempts[index] = now
    out[i] = now
  end
end
for index, now in pairs(attempts) do
  writes[#writes + 1] = 'a' .. index
  writes[#writes + 1] = now
end
if #writes > 0 then hset(KEYS[1], writes) end
return out
