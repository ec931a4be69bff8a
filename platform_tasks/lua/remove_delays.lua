-- Remove entries of the delay store once their publish was confirmed by the broker.
--
-- KEYS[1]  sorted set of due times; KEYS[2] hash of entries; KEYS[3] set of claimed ids
-- ARGV     entry ids
-- All structures change together, so an entry is never half removed.
local removed = 0
for _, id in ipairs(ARGV) do
  removed = removed + redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('SREM', KEYS[3], id)
end
return removed
