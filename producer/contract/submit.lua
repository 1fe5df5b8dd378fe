-- Write queued job records, one call for many jobs (not two commands a job).
-- KEYS: job keys. ARGV, 7 per job: record ttl, kind, tenant, lane, created_at,
-- metadata JSON and reply list ("" for none).
for i, key in ipairs(KEYS) do
  local a = (i - 1) * 7
  redis.call('HSET', key, 'status', 'queued', 'kind', ARGV[a + 2], 'tenant', ARGV[a + 3],
             'lane', ARGV[a + 4], 'created_at', ARGV[a + 5], 'attempts', 0)
  if ARGV[a + 6] ~= '' then redis.call('HSET', key, 'metadata', ARGV[a + 6]) end
  if ARGV[a + 7] ~= '' then redis.call('HSET', key, 'reply', ARGV[a + 7]) end
  redis.call('EXPIRE', key, tonumber(ARGV[a + 1]))
end
return #KEYS
