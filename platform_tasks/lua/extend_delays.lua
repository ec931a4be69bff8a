-- Extend the lease of claimed delay-store entries whose confirms are still awaited.
--
-- KEYS[1]  sorted set of due times
-- ARGV[1]  lease in milliseconds, from the Redis clock
-- ARGV[2…] entry ids
-- XX: an entry removed meanwhile is not re-added.
local now = redis.call('TIME')
local until_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[1])
local extended = 0
for i = 2, #ARGV do
  extended = extended + redis.call('ZADD', KEYS[1], 'XX', 'CH', until_ms, ARGV[i])
end
return extended
