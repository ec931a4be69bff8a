-- Upkeep of a fair queue's tenant lanes, shared by the scripts that change them
-- (transport_fair_fetch.lua, transport_restore.lua), included by script_source.
--
-- A fair list q is a table of keys:
--   q.arrivals  the queue list, where every publisher pushes
--   q.ring      the tenants with waiting messages, in turn order
--   q.turn      messages the ring's head gave in its current turn
--   q.waiting   messages waiting in all lanes
--   q.lengths   sorted set: tenant -> length of its lane, for exactly the tenants on the
--               ring (so "is it on the ring" is one ZSCORE, and the gauges read the
--               largest lanes without a command per tenant)
--   q.heads     sorted set: tenant -> ready time (header platform_published_at) of the
--               oldest message of its lane, the next it gives; absent when that message
--               carries none (the queue-latency gauge reads the oldest head in one call)
--   q.prefix    prefix of the lane keys: lane of tenant t = prefix .. t
-- A lane is taken from its right end (RPOP): its oldest message is at index -1.

local TENANT_KEY = '"platform_tenant"'
local READY_KEY = '"platform_published_at"'
local PUSH_CHUNK = 1000
-- unpack() of a few thousand values overflows Lua's C stack ("too many results to
-- unpack"), so long runs are pushed in chunks.

-- The string value of header `key` (a JSON key literal, quotes included) without
-- decoding the JSON in the common case: outside JSON strings a '"' is never escaped, so
-- the key found once, followed by a plain value, is the header (kombu writes the body
-- base64-encoded). When the key appears twice, or its value has escapes, the message is
-- decoded to be sure.
local function header_of(item, key, pattern, name)
  local at = string.find(item, key, 1, true)
  if not at then return nil end
  local value = string.match(item, pattern, at + #key)
  if value and not string.find(item, key, at + #key, true) then return value end
  local ok, message = pcall(cjson.decode, item)
  if ok and type(message) == 'table' and type(message['headers']) == 'table' then
    local found = message['headers'][name]
    if found ~= nil and found ~= cjson.null then return found end
  end
  return nil
end

-- The tenant of a message: its header platform_tenant, '' when it has none.
local function tenant_of(item)
  local tenant = header_of(item, TENANT_KEY, '^%s*:%s*"([^"\\]*)"', 'platform_tenant')
  if type(tenant) == 'string' then return tenant end
  return ''
end

-- The ready time a message carries (header platform_published_at), nil without one.
local function ready_at(item)
  local value = header_of(item, READY_KEY, '^%s*:%s*(-?[%d.]+[eE]?[-+]?%d*)[,}%s]',
    'platform_published_at')
  return tonumber(value)
end

-- Record the ready time of tenant's lane head, `item` (nil: the lane is empty).
local function set_head(q, tenant, item)
  local at = item and ready_at(item)
  if at then
    redis.call('ZADD', q.heads, at, tenant)
  else
    redis.call('ZREM', q.heads, tenant)
  end
end

-- LPUSH `items` (oldest first) onto `lane`; returns the lane's length.
local function push_behind(lane, items)
  local length = 0
  for from = 1, #items, PUSH_CHUNK do
    length = redis.call('LPUSH', lane, unpack(items, from, math.min(from + PUSH_CHUNK - 1, #items)))
  end
  return length
end

-- After `pushed` messages went onto tenant's lane, now `length` long: the tenant joins
-- the ring's tail unless it is on it already, whatever its lane held before (a lane
-- left off the ring, by an interrupted purge of an earlier release, is taken again and
-- its messages counted as waiting). Returns true if the tenant joined.
local function enlist(q, tenant, length, pushed)
  local joined = not redis.call('ZSCORE', q.lengths, tenant)
  if joined then
    redis.call('RPUSH', q.ring, tenant)
    if length > pushed then redis.call('INCRBY', q.waiting, length - pushed) end
  end
  redis.call('ZADD', q.lengths, length, tenant)
  return joined
end

-- The tenant leaves the ring's head (its lane is empty).
local function retire(q, tenant)
  redis.call('LPOP', q.ring)
  redis.call('ZREM', q.lengths, tenant)
  redis.call('ZREM', q.heads, tenant)
end
