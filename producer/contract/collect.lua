-- Which of many jobs are finished, with their envelopes: one call per pass of a bulk reader.
-- KEYS: job records. ARGV: the most envelope bytes to return.
-- Returns, per job that is not queued or running (a missing record counts as finished):
-- its index in KEYS (from 0), its tenant and its envelope. The envelope is "" past the byte
-- budget or where a record holds none: the caller reads those records whole.
local budget = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local s = redis.pcall('HGET', key, 'status')
  if type(s) == 'table' then s = 'unreadable' end  -- not a hash: the caller's read reports it
  if s ~= 'queued' and s ~= 'running' then
    local tenant, result = '', ''
    if s and s ~= 'unreadable' and budget > 0 then
      local f = redis.call('HMGET', key, 'tenant', 'result')
      tenant = f[1] or ''
      if f[2] then
        result = f[2]
        budget = budget - #result
      end
    end
    out[#out + 1] = i - 1
    out[#out + 1] = tenant
    out[#out + 1] = result
  end
end
return out
