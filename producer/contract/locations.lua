-- Prepended to the chunk scripts: field x of a chunk's record holds a uint16 (little-endian) per
-- job: 0 not terminal, 65535 its envelope is field r<i>, k its result is a row of block b<k>
-- (blocks.py). One field read and one written per call, whatever the number of jobs.
local IN_ENVELOPE = 65535
local function located(x, i)
  if not x then return 0 end
  local a, b = string.byte(x, 2 * i + 1, 2 * i + 2)
  return (a or 0) + 256 * (b or 0)
end
-- x with each index of marks (index -> location) set; x may be missing or short.
local function relocate(x, n, marks)
  x = x or ''
  if #x < 2 * n then x = x .. string.rep('\0', 2 * n - #x) end
  local order = {}
  for i in pairs(marks) do order[#order + 1] = i end
  table.sort(order)
  local parts, at = {}, 1
  for _, i in ipairs(order) do
    local v = marks[i]
    parts[#parts + 1] = string.sub(x, at, 2 * i)
    parts[#parts + 1] = string.char(v % 256, math.floor(v / 256))
    at = 2 * i + 3
  end
  parts[#parts + 1] = string.sub(x, at)
  return table.concat(parts)
end
