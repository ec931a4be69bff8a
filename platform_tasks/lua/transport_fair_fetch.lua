-- Take the next message fairly across tenants and record it as unacked, in one step.
--
-- The fair variant of transport_fetch.lua (same unacked record, same wrapping of
-- unreadable items, same reply), used by a channel that consumes at least one fair queue.
--
-- KEYS[1]  hash:       delivery tag -> [message, exchange, routing key] (kombu's "unacked")
-- KEYS[2]  sorted set: delivery tag -> time it was taken (kombu's "unacked_index")
-- KEYS[3]  list:       unreadable messages an earlier version set aside (drained here)
-- KEYS[3 + 6(i-1) + 1..6] for list i, in consumption order (queues x priority steps):
--          the queue list (where every publisher pushes: the arrival list), the ring of
--          tenants with waiting messages, the count already taken in the ring head's
--          turn, the count of messages waiting in the lanes, the lane lengths and the
--          lane heads' ready times (fair_lane_parts.lua)
-- ARGV[1]  how many arrivals one call sorts into lanes at most, per list
-- ARGV[2]  'fetch' (sort, then take a message) or 'sort' (only sort: the worker's timer
--          sorts a backlog this way between fetches, so a new tenant behind a burst
--          waits for the sort, not for as many jobs as the burst has thousands)
-- ARGV[3]  W, the number of tenants with a weight, then ARGV[4..3+2W] tenant, weight
--          pairs (messages a tenant gives per turn; a tenant not named gives 1)
-- ARGV[3 + 2W + 5(i-1) + 1..5] for list i: '1' to record the message as unacked ('0' for
--          no_ack), the queue name, the priority step, 'fair' or 'plain', the prefix of
--          the lane keys (lane of tenant t = prefix .. t; messages without a tenant
--          header go to the lane of the empty tenant, the default lane)
--
-- A fair list is consumed in two moves, both inside this one script:
-- 1. Sort: up to ARGV[1] messages are taken from the arrival list (oldest first) and
--    pushed onto the lane of their tenant (header platform_tenant); a tenant not on the
--    ring joins it at its tail. Publishers never change: kombu, the delay
--    store's promotion and a stock producer all push onto the arrival list.
-- 2. Pick: the ring's head tenant gives its oldest message. After weight messages in a
--    row (1 by default) the head moves to the tail; a tenant whose lane is empty leaves
--    the ring. So tenants with work alternate A, B, C, A, B, C whatever their backlogs.
-- A message is at every moment on exactly one list (arrival list or lane) or in the
-- unacked hash: a worker killed at any point loses nothing, as with transport_fetch.
--
-- Returns {i, message} for a message of list i, or {0} when every list is empty; in
-- 'sort' mode {0, n}: n arrivals were sorted.
local B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'

local function base64(data)
  local out = {}
  for i = 1, #data, 3 do
    local a, b, c = string.byte(data, i, i + 2)
    local v = a * 65536 + (b or 0) * 256 + (c or 0)
    local s1 = math.floor(v / 262144) % 64
    local s2 = math.floor(v / 4096) % 64
    local s3 = math.floor(v / 64) % 64
    local s4 = v % 64
    out[#out + 1] = string.sub(B64, s1 + 1, s1 + 1) .. string.sub(B64, s2 + 1, s2 + 1)
      .. (b and string.sub(B64, s3 + 1, s3 + 1) or '=')
      .. (c and string.sub(B64, s4 + 1, s4 + 1) or '=')
  end
  return table.concat(out)
end

local lists = (#KEYS - 3) / 6
local budget = tonumber(ARGV[1])
local mode = ARGV[2]
local weighted = tonumber(ARGV[3])
local weights = {}
for w = 1, weighted do
  weights[ARGV[2 + 2 * w]] = tonumber(ARGV[3 + 2 * w])
end
local base = 3 + 2 * weighted
local now = redis.call('TIME')
local score = string.format('%.6f', tonumber(now[1]) + tonumber(now[2]) / 1000000)

local function key(i, k) return KEYS[3 + 6 * (i - 1) + k] end
local function arg(i, k) return ARGV[base + 5 * (i - 1) + k] end

local function record(i, tag, body, exchange, routing_key)
  if arg(i, 1) == '1' then
    redis.call('HSET', KEYS[1], tag,
      '[' .. body .. ',' .. cjson.encode(exchange) .. ',' .. cjson.encode(routing_key) .. ']')
    redis.call('ZADD', KEYS[2], score, tag)
  end
end

local function wrap(i, item, why)
  local queue = arg(i, 2)
  local tag = 'unreadable.' .. redis.sha1hex(item) .. '.' .. now[1] .. now[2]
  local wrapped = cjson.encode({
    ['body'] = base64(item),
    ['content-encoding'] = 'binary',
    ['content-type'] = 'application/x-platform-unreadable',
    ['headers'] = {['platform_unreadable'] = why},
    ['properties'] = {
      ['body_encoding'] = 'base64',
      ['delivery_tag'] = tag,
      ['delivery_mode'] = 2,
      ['priority'] = tonumber(arg(i, 3)),
      ['delivery_info'] = {['exchange'] = '', ['routing_key'] = queue},
    },
  })
  record(i, tag, wrapped, '', queue)
  return {i, wrapped}
end

local function deliver(i, item)
  local ok, message = pcall(cjson.decode, item)
  if not ok or type(message) ~= 'table' then
    return wrap(i, item, 'not a JSON object')
  end
  local properties = message['properties']
  local tag = type(properties) == 'table' and properties['delivery_tag']
  if type(tag) ~= 'string' then
    return wrap(i, item, 'JSON without a kombu delivery tag')
  end
  local exchange, routing_key = '', ''
  local info = properties['delivery_info']
  if type(info) == 'table' then
    if type(info['exchange']) == 'string' then exchange = info['exchange'] end
    if type(info['routing_key']) == 'string' then routing_key = info['routing_key'] end
  end
  record(i, tag, item, exchange, routing_key)
  return {i, item}
end

-- include: fair_lane_parts

local function lanes(i)
  return {
    arrivals = key(i, 1), ring = key(i, 2), turn = key(i, 3), waiting = key(i, 4),
    lengths = key(i, 5), heads = key(i, 6), prefix = arg(i, 5),
  }
end

local function sort(i)
  local q = lanes(i)
  -- The oldest arrivals are at the list's right end: LRANGE gives them newest first.
  local items = redis.call('LRANGE', q.arrivals, -budget, -1)
  local n = #items
  if n == 0 then return 0 end
  local order, groups = {}, {}
  for j = n, 1, -1 do
    local tenant = tenant_of(items[j])
    local group = groups[tenant]
    if not group then
      group = {}
      groups[tenant] = group
      order[#order + 1] = tenant
    end
    group[#group + 1] = items[j]
  end
  for _, tenant in ipairs(order) do
    local group = groups[tenant]
    local lane = q.prefix .. tenant
    -- Oldest first, so the lane (LPUSH in, RPOP out) stays in arrival order.
    local length = push_behind(lane, group)
    local joined = enlist(q, tenant, length, #group)
    if length == #group then
      set_head(q, tenant, group[1])
    elseif joined then
      set_head(q, tenant, redis.call('LINDEX', lane, -1))
    end
  end
  redis.call('LTRIM', q.arrivals, 0, -(n + 1))
  redis.call('INCRBY', q.waiting, n)
  return n
end

local function pick(i)
  local q = lanes(i)
  local tenant = redis.call('LINDEX', q.ring, 0)
  while tenant do
    local lane = q.prefix .. tenant
    local item = redis.call('RPOP', lane)
    if item then
      if redis.call('DECR', q.waiting) < 0 then redis.call('SET', q.waiting, 0) end
      -- The turn count is 0 whenever the head changes, so a tenant of weight 1 (the
      -- default) needs no count: it rotates or leaves at once.
      local weight = weights[tenant] or 1
      local left = redis.call('LLEN', lane)
      if left == 0 then
        retire(q, tenant)
        if weight > 1 then redis.call('SET', q.turn, 0) end
      else
        redis.call('ZADD', q.lengths, left, tenant)
        set_head(q, tenant, redis.call('LINDEX', lane, -1))
        if weight <= 1 then
          redis.call('LMOVE', q.ring, q.ring, 'LEFT', 'RIGHT')
        elseif redis.call('INCR', q.turn) >= weight then
          redis.call('LMOVE', q.ring, q.ring, 'LEFT', 'RIGHT')
          redis.call('SET', q.turn, 0)
        end
      end
      return item
    end
    -- A tenant whose lane was emptied outside this script: leaves the ring.
    retire(q, tenant)
    redis.call('SET', q.turn, 0)
    tenant = redis.call('LINDEX', q.ring, 0)
  end
  return nil
end

if mode == 'sort' then
  local sorted = 0
  for i = 1, lists do
    if arg(i, 4) == 'fair' then sorted = sorted + sort(i) end
  end
  return {0, sorted}
end

if lists > 0 then
  local legacy = redis.call('RPOP', KEYS[3])
  if legacy then
    return wrap(1, legacy, 'set aside by an earlier version of the transport')
  end
end

for i = 1, lists do
  local item
  if arg(i, 4) == 'fair' then
    sort(i)
    item = pick(i)
  else
    item = redis.call('RPOP', key(i, 1))
  end
  if item then
    return deliver(i, item)
  end
end
return {0}
