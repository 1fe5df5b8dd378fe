-- Claim due packages of one lane, fairly between tenants (docs/scheduling.md).
-- KEYS[1]: the lane's arq queue (every package not finished, as arq keeps it).
-- ARGV: now (ms), slots, in-progress ttl (ms), arq's in-progress key prefix, the lane's
-- fair-share prefix, the shares hash, then the packages this worker finished since its last call.
-- Returns id, score, id, score, ... of the packages claimed.
--
-- Start-time fair queueing over tenants: 'active' orders the tenants with packages lined up by
-- their tag (virtual time); a claim serves the lowest, moves the lane's virtual time to that tag
-- and charges the tenant items / share. Each step is O(log tenants): nothing scans a queue.
local queue = KEYS[1]
local now, slots, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local running, F, shares = ARGV[4], ARGV[5], ARGV[6]
local META, ACTIVE, PARKED, TAGS = F .. 'meta', F .. 'active', F .. 'parked', F .. 'tags'
local LATER, LEASED, QUEUED, INFLIGHT = F .. 'later', F .. 'leased', F .. 'queued', F .. 'inflight'
local SCAN = 64  -- deferred packages and lease checks handled per call, at most

local function limits(tenant)  -- share (> 0) and cap on items in flight (nil: none)
  local raw = redis.call('HGET', shares, tenant)
  if not raw then return 1, nil end
  local s, c = string.match(raw, '^([^|]*)|(.*)$$')
  local share = tonumber(s) or 1
  if share <= 0 then share = 1 end
  return share, tonumber(c)
end

local function meta(id)  -- tenant, items, order of a package lined up by fair_enqueue.lua
  local raw = redis.call('HGET', META, id)
  if not raw then return nil end
  local tenant, items, order = string.match(raw, '^(.*)|(%d+)|(%d+)$$')
  return tenant, tonumber(items), order
end

local function add(hash, tenant, n)
  if redis.call('HINCRBY', hash, tenant, n) <= 0 then redis.call('HDEL', hash, tenant) end
end

local function busy(tenant)
  return tonumber(redis.call('HGET', INFLIGHT, tenant)) or 0
end

local function line_up(id, tenant, items, order)  -- at its own place in its tenant's line
  redis.call('ZADD', F .. 't:' .. tenant, order, id)
  add(QUEUED, tenant, items)
  if not redis.call('ZSCORE', PARKED, tenant) then
    redis.call('ZADD', ACTIVE, 'NX', redis.call('HGET', TAGS, tenant) or 0, tenant)
  end
end

local function unpark(tenant)
  local tag = redis.call('ZSCORE', PARKED, tenant)
  if not tag then return end
  local _, cap = limits(tenant)
  if not cap or busy(tenant) < cap then
    redis.call('ZREM', PARKED, tenant)
    redis.call('ZADD', ACTIVE, tag, tenant)
  end
end

-- A claimed package that a worker finished, or whose lease came up for a check: still
-- running (its in-progress key lives), finished (arq took it off the queue), or back in line.
local function settle(id)
  local left = redis.call('PTTL', running .. id)
  local score = redis.call('ZSCORE', queue, id)
  if score and left > 0 then
    if redis.call('ZSCORE', LEASED, id) then redis.call('ZADD', LEASED, now + left, id) end
    return
  end
  if redis.call('ZREM', LEASED, id) == 0 then return end
  local tenant, items, order = meta(id)
  if not tenant then return end
  add(INFLIGHT, tenant, -items)
  if score then
    line_up(id, tenant, items, order)
  else
    redis.call('HDEL', META, id)
  end
  unpark(tenant)
end

for i = 7, #ARGV do settle(ARGV[i]) end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', LEASED, '-inf', now, 'LIMIT', 0, SCAN)) do settle(id) end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', LATER, '-inf', now, 'LIMIT', 0, SCAN)) do
  redis.call('ZREM', LATER, id)
  local tenant, items, order = meta(id)
  if tenant and redis.call('ZSCORE', queue, id) then
    line_up(id, tenant, items, order)
  else
    redis.call('HDEL', META, id)
  end
end

local out = {}
local served = {}  -- tenant -> items claimed by this call
local vtime = tonumber(redis.call('GET', F .. 'vtime')) or 0
local steps = 4 * slots + SCAN  -- each step claims, or retires a tenant or a stale entry
while #out < 2 * slots and steps > 0 do
  steps = steps - 1
  local top = redis.call('ZRANGE', ACTIVE, 0, 0, 'WITHSCORES')
  if #top == 0 then break end
  local tenant, tag = top[1], tonumber(top[2])
  local share, cap = limits(tenant)
  local line = F .. 't:' .. tenant
  local head = redis.call('ZRANGE', line, 0, 0)
  if #head == 0 then  -- its line is empty: it leaves, and keeps its tag for when it comes back
    redis.call('ZREM', ACTIVE, tenant)
    redis.call('HSET', TAGS, tenant, tag)
  elseif cap and busy(tenant) >= cap then  -- at its cap: waits aside until a package of it ends
    redis.call('ZREM', ACTIVE, tenant)
    redis.call('ZADD', PARKED, tag, tenant)
  else
    local id = head[1]
    redis.call('ZREM', line, id)
    local _, items = meta(id)
    items = items or 1
    add(QUEUED, tenant, -items)
    local score = redis.call('ZSCORE', queue, id)
    local left = redis.call('PTTL', running .. id)
    if score and left <= 0 then
      local start = math.max(tag, vtime)
      vtime = start
      redis.call('PSETEX', running .. id, ttl, '1')
      redis.call('ZADD', LEASED, now + ttl, id)
      add(INFLIGHT, tenant, items)
      redis.call('HINCRBY', F .. 'served', tenant, items)
      served[tenant] = (served[tenant] or 0) + items
      redis.call('ZADD', ACTIVE, start + items / share, tenant)
      out[#out + 1] = id
      out[#out + 1] = score
    elseif score then  -- running already (arq put it back while it ran): its lease is watched
      if not redis.call('ZSCORE', LEASED, id) then add(INFLIGHT, tenant, items) end
      redis.call('ZADD', LEASED, now + left, id)
    else  -- finished or dropped while it waited
      redis.call('HDEL', META, id)
    end
  end
end
redis.call('SET', F .. 'vtime', vtime)

-- The sweep: a package in arq's queue that no line knows (queued by a producer that predates
-- the lines, or put back by arq itself) is claimed as it comes, so none waits forever. At most
-- once a second, SCAN entries from a cursor that walks the queue by rank.
if #out < 2 * slots and redis.call('SET', F .. 'swept_at', now, 'PX', 1000, 'NX') then
  local at = tonumber(redis.call('GET', F .. 'sweep')) or 0
  local window = redis.call('ZRANGE', queue, at, at + SCAN - 1, 'WITHSCORES')
  local resume = (#window < 2 * SCAN) and 0 or at + SCAN
  for i = 1, #window, 2 do
    local id = window[i]
    if #out >= 2 * slots then resume = at + (i - 1) / 2 break end
    if tonumber(window[i + 1]) > now then resume = 0 break end
    if redis.call('HEXISTS', META, id) == 0 and redis.call('EXISTS', running .. id) == 0 then
      redis.call('HSET', META, id, '${UNLINED}|1|0')
      redis.call('PSETEX', running .. id, ttl, '1')
      redis.call('ZADD', LEASED, now + ttl, id)
      add(INFLIGHT, '${UNLINED}', 1)
      out[#out + 1] = id
      out[#out + 1] = window[i + 1]
    end
  end
  redis.call('SET', F .. 'sweep', resume)
end
if #out > 0 then  -- items served per tenant in slices of ${SLICE_MS} ms, for items/s
  local slice = F .. 's:' .. math.floor(now / ${SLICE_MS})
  for tenant, items in pairs(served) do redis.call('HINCRBY', slice, tenant, items) end
  redis.call('EXPIRE', slice, ${SLICE_TTL_S})
end
return out
