-- Count one return (unroutable) of a claimed delay-store entry and, under the bound,
-- make it due again after a doubling back-off; one script, so the count and the due time
-- never disagree.
--
-- KEYS[1]  sorted set of due times
-- KEYS[2]  hash entry id -> returns so far
-- ARGV[1]  entry id
-- ARGV[2]  back-off after the first return, in milliseconds
-- ARGV[3]  returns after which the entry is not postponed (the caller dead-letters it)
-- Returns the entry's count of returns. XX: an entry another promoter removed meanwhile
-- is not re-added.
local returns = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
if returns < tonumber(ARGV[3]) then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local backoff = tonumber(ARGV[2]) * 2 ^ (returns - 1)
  redis.call('ZADD', KEYS[1], 'XX', now_ms + math.floor(backoff), ARGV[1])
end
return returns
