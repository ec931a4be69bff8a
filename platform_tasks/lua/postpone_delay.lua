-- Give one claimed entry of the delay store back, due after a back-off (RabbitMQ returned
-- its message as unroutable).
--
-- KEYS[1]  sorted set of due times
-- ARGV[1]  entry id
-- ARGV[2]  back-off in milliseconds, counted from the Redis clock
-- XX: an entry another promoter removed meanwhile is not re-added.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now_ms + tonumber(ARGV[2]), ARGV[1])
