-- Prepended to the chunk scripts. Two fields of a chunk's record hold a value per job, so a call
-- reads and writes one field however many jobs it touches (starting a job cost Redis 2.1-2.7 us
-- of command time with a field each, 0.55-0.67 us in one field: python -m bench.chunk_scripts):
-- x: a uint16 per job (little-endian): 0 not terminal, 65535 its envelope is field r<i>, k its
--    result is a row of block b<k> (blocks.py);
-- y: a byte per job: its attempts so far (0: never started).
local IN_ENVELOPE = 65535
local function located(x, i)
  if not x then return 0 end
  local a, b = string.byte(x, 2 * i + 1, 2 * i + 2)
  return (a or 0) + 256 * (b or 0)
end
local function attempts_of(y, i)
  return (y and string.byte(y, i + 1)) or 0
end
-- s (width bytes per job, n jobs; missing or short is zeros) with each index of marks set:
-- its bytes into a table and back with string.byte/char, a slice at a time (unpack's limit).
local function rewrite(s, n, marks, width)
  local size, bytes = width * n, {}
  s = s or ''
  for at = 1, math.min(#s, size), 4000 do
    local part = {string.byte(s, at, math.min(at + 3999, #s, size))}
    for j = 1, #part do bytes[at + j - 1] = part[j] end
  end
  for j = #s + 1, size do bytes[j] = 0 end
  for i, v in pairs(marks) do
    if width == 2 then
      bytes[2 * i + 1], bytes[2 * i + 2] = v % 256, math.floor(v / 256)
    else
      bytes[i + 1] = math.min(v, 255)
    end
  end
  local parts = {}
  for at = 1, size, 4000 do parts[#parts + 1] = string.char(unpack(bytes, at, math.min(at + 3999, size))) end
  return table.concat(parts)
end
local function relocate(x, n, marks) return rewrite(x, n, marks, 2) end
-- Start jobs of a chunk: per index, n > 0 run it (its n-th attempt), 0 already terminal, -1 no
-- such job, -2 the key is not a chunk record; attempts are written in one field. Also returns
-- how many of them start.
local function start_jobs(key, indices)
  local t = redis.call('TYPE', key)['ok']
  local out = {}
  if t ~= 'hash' then
    for i = 1, #indices do out[i] = (t == 'none') and -1 or -2 end
    return out, 0
  end
  local got = redis.call('HMGET', key, 'n', 'x', 'y')
  local n = tonumber(got[1])
  local marks, started = {}, 0
  for i, index in ipairs(indices) do
    local k = tonumber(index)
    if not n then
      out[i] = -2
    elseif not k or k < 0 or k >= n then
      out[i] = -1
    elseif located(got[2], k) ~= 0 then
      out[i] = 0
    else
      local now = (marks[k] or attempts_of(got[3], k)) + 1
      if not marks[k] then started = started + 1 end
      marks[k] = now
      out[i] = now
    end
  end
  if started > 0 then redis.call('HSET', key, 'y', rewrite(got[3], n, marks, 1)) end
  return out, started
end
