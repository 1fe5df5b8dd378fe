-- Prepended to finish.lua and cancel.lua. A streamed job has a stream (`<root>:stream:<id>`,
-- created with the job): its terminal status event is appended in the same atomic step as
-- the result, so it is the stream's last entry and there is only ever one. Jobs without a
-- stream cost one EXISTS.
local function stream_terminal(key, root, envelope)
  local stream = root .. ':stream:' .. string.sub(key, #root + 6)
  if redis.call('EXISTS', stream) == 1 and redis.call('TYPE', stream)['ok'] == 'stream' then
    redis.call('XADD', stream, 'MAXLEN', '~', $STREAM_MAXLEN, '*', 'event', 'status', 'data', envelope)
    redis.call('EXPIRE', stream, $STREAM_DONE_TTL_S)
  end
end
