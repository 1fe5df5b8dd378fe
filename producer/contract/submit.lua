-- Write queued job records, one call for many jobs (not two commands a job): one HSET and one
-- EXPIRE each. KEYS: job keys. ARGV, 8 per job: record ttl, kind, tenant, lane, created_at,
-- metadata JSON, reply list ("" for none) and "1" if the job has a stream ("0" if not: the
-- finish script then knows without asking Redis).
for i, key in ipairs(KEYS) do
  local a = (i - 1) * 8
  local fields = {'status', 'queued', 'kind', ARGV[a + 2], 'tenant', ARGV[a + 3],
                  'lane', ARGV[a + 4], 'created_at', ARGV[a + 5], 'attempts', 0, 'stream', ARGV[a + 8]}
  if ARGV[a + 6] ~= '' then table.insert(fields, 'metadata'); table.insert(fields, ARGV[a + 6]) end
  if ARGV[a + 7] ~= '' then table.insert(fields, 'reply'); table.insert(fields, ARGV[a + 7]) end
  redis.call('HSET', key, unpack(fields))
  redis.call('EXPIRE', key, tonumber(ARGV[a + 1]))
end
return #KEYS
