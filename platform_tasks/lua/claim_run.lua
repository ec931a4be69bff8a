-- Claim the run of one point of a periodic task: at most one trigger of a point runs.
--
-- KEYS[1]  run marker: the newest point a worker took to run (ms since the epoch, no TTL)
-- ARGV[1]  point, ms since the epoch
--
-- Returns 1 when the point is newer than the marker (recorded: this trigger runs it), 0
-- when it is not (a redelivery or a duplicate of a point already taken: not run again).
local marker = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) <= marker then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
