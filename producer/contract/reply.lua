-- Prepended to finish.lua and cancel.lua. A record may name its producer's reply list (field
-- `reply`): the terminal envelope is pushed there too, as "<job id> <envelope>", in the same
-- atomic step. Only a list under `<root>:reply:` is ever written, whatever a record says. A
-- reader that went away leaves a list that expires; one that falls behind loses its oldest.
local function reply(key, root, envelope)
  local to = redis.call('HGET', key, 'reply')
  local prefix = root .. ':reply:'
  if to and string.sub(to, 1, #prefix) == prefix then
    local t = redis.call('TYPE', to)['ok']
    if t ~= 'none' and t ~= 'list' then return end  -- not a reply list: the result stands alone
    local id = string.sub(key, #root + 6)
    redis.call('RPUSH', to, id .. ' ' .. envelope)
    redis.call('LTRIM', to, -$REPLY_MAX, -1)
    redis.call('EXPIRE', to, $REPLY_TTL_S)
  end
end
