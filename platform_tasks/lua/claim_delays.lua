-- Claim due entries of the delay store for a promoter that publishes them elsewhere.
--
-- KEYS[1]  sorted set: entry id -> due time (ms since the epoch)
-- KEYS[2]  hash:       entry id -> encoded entry
-- KEYS[3]  set of entry ids ever claimed (kept until the entry is removed)
-- ARGV[1]  maximum number of entries to claim
-- ARGV[2]  lease in ms
--
-- A claimed entry stays in the store: its score moves to now + lease, so no other
-- promoter takes it while this one publishes, and a promoter killed before removing it
-- (after or before its broker confirmed the publish) leaves it to be claimed again when
-- the lease ends: at least once. Due-ness is judged by the Redis server clock (TIME).
-- The entry is marked claimed in KEYS[3], released or not: from now on its data may be
-- on the broker, so a debounce publish must not replace it (unique_schedule.lua reads
-- the mark and stores a new job instead of data the removal would drop unpublished).
-- Returns {more_due, ms until the next entry is due (-1: none), id1, entry1, id2, ...}.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local limit = tonumber(ARGV[1])
local lease_until = now_ms + tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, limit)
local out = {0, -1}
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    redis.call('ZADD', KEYS[1], lease_until, id)
    redis.call('SADD', KEYS[3], id)
    table.insert(out, id)
    table.insert(out, raw)
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('SREM', KEYS[3], id)
  end
end
if #ids == limit then out[1] = 1 end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #first == 2 then
  local wait = tonumber(first[2]) - now_ms
  if wait < 0 then wait = 0 end
  out[2] = wait
end
return out
