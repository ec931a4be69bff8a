-- Claim the run of one point of a periodic task: at most one trigger of a point runs, and
-- none after the point's period. Judged by Redis TIME, never by the worker's clock.
--
-- KEYS[1]  run marker: the newest point a worker took to run (ms since the epoch, no TTL)
-- ARGV[1]  point, ms since the epoch
-- ARGV[2]  end of the point's period, ms, or '' (a trigger from a beat that did not say)
--
-- Returns 'run' (recorded: this trigger runs the point), 'taken' (a redelivery or a
-- duplicate of a point already taken: not run again) or 'late' (the period has ended).
local marker = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) <= marker then
  return 'taken'
end
if ARGV[2] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now >= tonumber(ARGV[2]) then
    return 'late'
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return 'run'
