-- Give claimed entries of the delay store back, due now (their publish was not confirmed).
--
-- KEYS[1]  sorted set of due times
-- ARGV     entry ids
-- XX: an entry another promoter removed meanwhile (it published it) is not re-added.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local released = 0
for _, id in ipairs(ARGV) do
  released = released + redis.call('ZADD', KEYS[1], 'XX', 'CH', now_ms, id)
end
return released
