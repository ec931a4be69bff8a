-- Take the next message and record it as unacked, in one atomic step.
--
-- KEYS[1]  hash:       delivery tag -> [message, exchange, routing key] (kombu's "unacked")
-- KEYS[2]  sorted set: delivery tag -> time it was taken (kombu's "unacked_index")
-- KEYS[3]  list:       unreadable messages an earlier version set aside (drained here)
-- KEYS[4..] queue lists in consumption order (queues x priority steps)
-- ARGV[i]          '1' to record the message taken from KEYS[i + 3] as unacked, '0' when
--                  its consumer does not ack (no_ack)
-- ARGV[n + i]      the queue name of KEYS[i + 3] (n = #KEYS - 3)
-- ARGV[2n + i]     its priority step
--
-- Stock kombu pops with BRPOP and records the message afterwards in a second round trip;
-- a worker killed in between loses the message. Here the pop and the record are one
-- script, so a message is always either on its queue or in the unacked hash, where the
-- visibility-timeout sweep finds it again. Times are Redis TIME, so sweepers on machines
-- with skewed clocks agree.
--
-- The hash value is built by concatenation instead of re-encoding the message, so the
-- stored message is byte-for-byte what the publisher sent.
--
-- An item that is not a readable kombu message (not JSON, no delivery tag) is wrapped in
-- one: its bytes in base64 as the body, header ``platform_unreadable`` saying why, the
-- anonymous exchange and its queue as routing key, a fresh delivery tag. It is recorded
-- and delivered like any message, so the worker's consumer dead-letters it (and a
-- requeue puts the wrapped, now readable, message back on its queue). Nothing is dropped
-- and nothing is set aside where it could pile up.
--
-- Returns {i, message} for the message taken from KEYS[i + 3], or {0} when every list
-- is empty.
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

local lists = #KEYS - 3
local now = redis.call('TIME')
local score = string.format('%.6f', tonumber(now[1]) + tonumber(now[2]) / 1000000)

local function record(i, tag, body, exchange, routing_key)
  if ARGV[i - 3] == '1' then
    redis.call('HSET', KEYS[1], tag,
      '[' .. body .. ',' .. cjson.encode(exchange) .. ',' .. cjson.encode(routing_key) .. ']')
    redis.call('ZADD', KEYS[2], score, tag)
  end
end

local function wrap(i, item, why)
  local queue = ARGV[lists + i - 3]
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
      ['priority'] = tonumber(ARGV[2 * lists + i - 3]),
      ['delivery_info'] = {['exchange'] = '', ['routing_key'] = queue},
    },
  })
  record(i, tag, wrapped, '', queue)
  return {i - 3, wrapped}
end

if lists > 0 then
  local legacy = redis.call('RPOP', KEYS[3])
  if legacy then
    return wrap(4, legacy, 'set aside by an earlier version of the transport')
  end
end

for i = 4, #KEYS do
  local item = redis.call('RPOP', KEYS[i])
  if item then
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
    return {i - 3, item}
  end
end
return {0}
