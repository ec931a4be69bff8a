-- Remove entries of the delay store once their publish was confirmed by the broker.
--
-- KEYS[1]  sorted set of due times; KEYS[2] hash of entries
-- ARGV     entry ids
-- Both structures change together, so an entry is never half removed.
local removed = 0
for _, id in ipairs(ARGV) do
  removed = removed + redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
end
return removed
