-- Prepended to finish.lua and cancel.lua. A streamed job has a stream (`<root>:stream:<id>`,
-- created with the job): its terminal status event is appended in the same atomic step as
-- the result, so it is the stream's last entry and there is only ever one. The record's
-- `stream` field (read by the caller as `flag`) says whether there is one: "0" costs nothing;
-- a record without the field (written before it existed) is asked of Redis. NOMKSTREAM leaves
-- a stream that expired alone, and a key of another type answers with an error that pcall
-- hands back, so neither stops the result.
local function stream_terminal(key, root, envelope, flag)
  if flag == '0' then return end
  local stream = root .. ':stream:' .. string.sub(key, #root + 6)
  if not flag and redis.call('EXISTS', stream) == 0 then return end
  local added = redis.pcall('XADD', stream, 'NOMKSTREAM', 'MAXLEN', '~', $STREAM_MAXLEN, '*',
                            'event', 'status', 'data', envelope)
  if type(added) == 'string' then redis.call('EXPIRE', stream, $STREAM_DONE_TTL_S) end
end
