-- Prepended to chunk_start.lua and chunk_finish.lua: HMGET and HSET of many fields in slices,
-- since unpack() of more than 8 000 values fails in Redis's Lua.
local function hmget(key, fields)
  local out = {}
  for s = 1, #fields, 4000 do
    local part = redis.call('HMGET', key, unpack(fields, s, math.min(s + 3999, #fields)))
    for i = 1, #part do out[s + i - 1] = part[i] end
  end
  return out
end
local function hset(key, pairs_)
  for s = 1, #pairs_, 4000 do
    redis.call('HSET', key, unpack(pairs_, s, math.min(s + 3999, #pairs_)))
  end
end
