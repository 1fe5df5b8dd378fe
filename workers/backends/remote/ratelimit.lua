-- One remote's limits, shared by every worker: requests/min and tokens/min as GCRA token
-- buckets (theoretical arrival times), a cap on requests in flight (leases that expire, so a
-- killed worker's slot comes back), and a rate factor a 429 halves and time restores.
-- The clock is Redis's own TIME, so workers on hosts with skewed clocks share one timeline.
--
-- KEYS[1] state hash: req_tat, tok_tat, factor, cut_at, hold_until
-- KEYS[2] leases sorted set: lease id -> expiry
-- ARGV[1] op: acquire | release | penalise
-- acquire:  rpm, tpm, concurrency, burst, cost tokens, lease id, lease ttl s, recover s, floor
-- release:  lease id, tpm, token correction (actual - estimated), recover s, floor
-- penalise: retry-after s, recover s, floor
-- Returns {granted (1|0), wait seconds as a string, effective factor as a string}.

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local op = ARGV[1]
local st = redis.call('HMGET', KEYS[1], 'req_tat', 'tok_tat', 'factor', 'cut_at', 'hold_until')
local req_tat = tonumber(st[1]) or now
local tok_tat = tonumber(st[2]) or now
local factor = tonumber(st[3]) or 1
local cut_at = tonumber(st[4]) or now
local hold_until = tonumber(st[5]) or 0

local function effective(recover_s, floor)
  if factor >= 1 then return 1 end
  if recover_s <= 0 then return 1 end
  return math.min(1, factor + (now - cut_at) * (1 - floor) / recover_s)
end

local function keep()
  redis.call('EXPIRE', KEYS[1], 86400)
end

if op == 'acquire' then
  local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local burst, cost = tonumber(ARGV[5]), tonumber(ARGV[6])
  local lease, ttl = ARGV[7], tonumber(ARGV[8])
  local f = effective(tonumber(ARGV[9]), tonumber(ARGV[10]))
  local wait = 0
  if hold_until > now then wait = hold_until - now end
  if conc > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    if redis.call('ZCARD', KEYS[2]) >= conc then wait = math.max(wait, 0.02) end
  end
  local new_req, new_tok = req_tat, tok_tat
  if rpm > 0 then
    local interval = 60 / (rpm * f)
    local tat = math.max(req_tat, now)
    local ahead = tat - now - (burst - 1) * interval
    if ahead > 0 then wait = math.max(wait, ahead) end
    new_req = tat + interval
  end
  if tpm > 0 and cost > 0 then
    local per_token = 60 / (tpm * f)
    local tat = math.max(tok_tat, now)
    -- one second of the token budget may go at once (or one request alone, if larger)
    local window = math.max(1, cost * per_token)
    local ahead = tat + cost * per_token - now - window
    if ahead > 0 then wait = math.max(wait, ahead) end
    new_tok = tat + cost * per_token
  end
  if wait > 0 then return {0, tostring(wait), tostring(f)} end
  redis.call('HSET', KEYS[1], 'req_tat', tostring(new_req), 'tok_tat', tostring(new_tok))
  keep()
  if conc > 0 then
    redis.call('ZADD', KEYS[2], now + ttl, lease)
    redis.call('EXPIRE', KEYS[2], math.ceil(ttl) + 60)
  end
  return {1, '0', tostring(f)}
elseif op == 'release' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  local tpm, delta = tonumber(ARGV[3]), tonumber(ARGV[4])
  local f = effective(tonumber(ARGV[5]), tonumber(ARGV[6]))
  if tpm > 0 and delta ~= 0 then
    redis.call('HSET', KEYS[1], 'tok_tat', tostring(math.max(tok_tat + delta * 60 / (tpm * f), now - 1)))
    keep()
  end
  return {1, '0', tostring(f)}
elseif op == 'penalise' then
  local retry_after = tonumber(ARGV[2])
  local floor = tonumber(ARGV[4])
  local f = math.max(floor, effective(tonumber(ARGV[3]), floor) / 2)
  redis.call('HSET', KEYS[1], 'factor', tostring(f), 'cut_at', tostring(now),
    'hold_until', tostring(math.max(hold_until, now + retry_after)))
  keep()
  return {1, tostring(retry_after), tostring(f)}
end
return redis.error_reply('unknown op ' .. tostring(op))
