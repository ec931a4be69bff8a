-- Record a delivered message as unacked (messages that did not come through the fetch
-- script, e.g. from a fanout exchange consumed with acks).
--
-- KEYS[1]  unacked hash, KEYS[2] unacked index
-- ARGV[1]  delivery tag, ARGV[2] JSON [message, exchange, routing key]
local now = redis.call('TIME')
local score = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], string.format('%.6f', score), ARGV[1])
return 1
