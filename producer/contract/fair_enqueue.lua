-- Queue one package in its tenant's line of a lane (docs/scheduling.md). No KEYS: the keys
-- derive from the lane's prefix, as arq's own do from a job id.
-- ARGV: the lane's fair-share prefix, package id, tenant, items, order (ms), run at (ms), now (ms).
-- A package due later waits in the lane's deferred set; the claim lines it up when it is due.
local F, id, tenant, items, order = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
redis.call('HSET', F .. 'meta', id, tenant .. '|' .. items .. '|' .. order)
if tonumber(ARGV[6]) > tonumber(ARGV[7]) then
  redis.call('ZADD', F .. 'later', ARGV[6], id)
  return 0
end
redis.call('ZADD', F .. 't:' .. tenant, order, id)
redis.call('HINCRBY', F .. 'queued', tenant, items)
if not redis.call('ZSCORE', F .. 'parked', tenant) then
  redis.call('ZADD', F .. 'active', 'NX', redis.call('HGET', F .. 'tags', tenant) or 0, tenant)
end
return 1
