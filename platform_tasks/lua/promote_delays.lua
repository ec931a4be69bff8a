-- Move due entries of the delay store onto their broker lists, atomically.
--
-- KEYS[1]  sorted set: entry id -> due time (ms since the epoch)
-- KEYS[2]  hash:       entry id -> cjson {"q": list key, "m": wire message}
-- ARGV[1]  maximum number of entries to move in this call
--
-- Returns {moved, more_due, ms until the earliest entry left is due (-1: none)}: the
-- promoter sleeps until then (bounded by its poll interval) without another round trip.
--
-- Due-ness is judged by the Redis server clock (TIME), so promoters on machines with
-- skewed clocks agree. Because the whole script runs atomically, an entry is either still
-- in the store or already on its list: a promoter killed between two calls loses nothing
-- and two promoters never move the same entry twice.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local limit = tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, limit)
local moved = 0
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    local entry = cjson.decode(raw)
    redis.call('LPUSH', entry['q'], entry['m'])
    redis.call('HDEL', KEYS[2], id)
    moved = moved + 1
  end
  redis.call('ZREM', KEYS[1], id)
end
local more = 0
if #ids == limit then more = 1 end
local next_due = -1
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #first == 2 then
  next_due = tonumber(first[2]) - now_ms
  if next_due < 0 then next_due = 0 end
end
return {moved, more, next_due}
