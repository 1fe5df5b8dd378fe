-- Prepended to finish.lua and cancel.lua. A record may name its producer's reply list (field
-- `reply`, read by the caller as `to`): the terminal envelope is pushed there too, as
-- "<job id> <envelope>", in the same atomic step. Only a list under `<root>:reply:` is ever
-- written, whatever a record says; a key of another type there is left alone. A reader that
-- went away leaves a list that expires; one that falls behind loses its oldest.
local function reply(key, root, envelope, to)
  local prefix = root .. ':reply:'
  if to and string.sub(to, 1, #prefix) == prefix then
    local id = string.sub(key, #root + 6)
    local length = redis.pcall('RPUSH', to, id .. ' ' .. envelope)
    if type(length) ~= 'number' then return end  -- not a reply list: the result stands alone
    if length > $REPLY_MAX then redis.call('LTRIM', to, -$REPLY_MAX, -1) end
    -- A reader pops up to 1 024 at a time, so a list it keeps up with empties and comes back
    -- new (length 1), and one that falls behind passes a multiple of 256 within 256 pushes:
    -- its lifetime is renewed then rather than on every push.
    if length == 1 or length % 256 == 0 then redis.call('EXPIRE', to, $REPLY_TTL_S) end
  end
end
