-- Take the next message and record it as unacked, in one atomic step.
--
-- KEYS[1]  hash:       delivery tag -> [message, exchange, routing key] (kombu's "unacked")
-- KEYS[2]  sorted set: delivery tag -> time it was taken (kombu's "unacked_index")
-- KEYS[3]  list:       messages that are not readable kombu messages (quarantine)
-- KEYS[4..] queue lists in consumption order (queues x priority steps)
-- ARGV[i]  '1' to record the message taken from KEYS[i + 3] as unacked, '0' when its
--          consumer does not ack (no_ack)
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
-- Returns {i, message, quarantined} for the message taken from KEYS[i + 3], or
-- {0, quarantined} when every list is empty.
local quarantined = 0
for i = 4, #KEYS do
  while true do
    local item = redis.call('RPOP', KEYS[i])
    if not item then break end
    local ok, message = pcall(cjson.decode, item)
    local properties = ok and type(message) == 'table' and message['properties']
    local tag = type(properties) == 'table' and properties['delivery_tag']
    if type(tag) == 'string' then
      if ARGV[i - 3] == '1' then
        local exchange, routing_key = '', ''
        local info = properties['delivery_info']
        if type(info) == 'table' then
          if type(info['exchange']) == 'string' then exchange = info['exchange'] end
          if type(info['routing_key']) == 'string' then routing_key = info['routing_key'] end
        end
        local now = redis.call('TIME')
        local score = tonumber(now[1]) + tonumber(now[2]) / 1000000
        redis.call('HSET', KEYS[1], tag,
          '[' .. item .. ',' .. cjson.encode(exchange) .. ',' .. cjson.encode(routing_key) .. ']')
        redis.call('ZADD', KEYS[2], string.format('%.6f', score), tag)
      end
      return {i - 3, item, quarantined}
    end
    redis.call('LPUSH', KEYS[3], item)
    quarantined = quarantined + 1
  end
end
return {0, quarantined}
