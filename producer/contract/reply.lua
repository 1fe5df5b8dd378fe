-- Prepended to finish.lua and cancel.lua. A record may name its producer's reply list (field
-- `reply`, read by the caller as `to`): the terminal envelope is pushed there too, as
-- "<job id> <envelope>", in the same atomic step. Only a list under `<root>:reply:` is ever
-- written, whatever a record says; a key of another type there is left alone. A reader that
-- went away leaves a list that expires; one that falls behind loses its oldest.
local function reply_target(root, to)
  local prefix = root .. ':reply:'
  return to and string.sub(to, 1, #prefix) == prefix
end

-- After `n` elements made a list `length` long: trim it, and renew its lifetime when it is new
-- or passed a multiple of 256. A reader pops up to 1 024 at a time, so a list it keeps up with
-- empties and comes back new, and one that falls behind passes a multiple of 256 within 256
-- pushes: its lifetime is renewed then rather than on every push.
local function pushed(to, length, n)
  if length > $REPLY_MAX then redis.call('LTRIM', to, -$REPLY_MAX, -1) end
  local before = length - n
  if before == 0 or math.floor(length / 256) > math.floor(before / 256) then
    redis.call('EXPIRE', to, $REPLY_TTL_S)
  end
end

local function reply(key, root, envelope, to)
  if reply_target(root, to) then
    local length = redis.pcall('RPUSH', to, string.sub(key, #root + 6) .. ' ' .. envelope)
    if type(length) == 'number' then pushed(to, length, 1) end  -- else not a reply list: the result stands alone
  end
end

-- finish.lua's way: the envelopes of one call are collected, then pushed with one RPUSH per
-- reply list (a client's waiting jobs of one backend batch share one), not one per job.
local batched, lists = {}, {}
local function reply_later(key, root, envelope, to)
  if reply_target(root, to) then
    if not batched[to] then
      batched[to] = {}
      lists[#lists + 1] = to
    end
    local items = batched[to]
    items[#items + 1] = string.sub(key, #root + 6) .. ' ' .. envelope
  end
end

local function push_replies()
  for _, to in ipairs(lists) do
    local items = batched[to]
    for first = 1, #items, 1000 do  -- within Lua's bound on unpacked arguments
      local last = math.min(first + 999, #items)
      local length = redis.pcall('RPUSH', to, unpack(items, first, last))
      if type(length) ~= 'number' then break end
      pushed(to, length, last - first + 1)
    end
  end
end
