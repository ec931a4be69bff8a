-- Admit one scheduled point of one job, or say why not. Atomic; judged by Redis TIME.
--
-- KEYS[1]  marker: the job's last admitted point (ms since the epoch, no TTL)
-- KEYS[2]  lease:  the job's running lease (owner token, with a TTL)
-- ARGV[1]  point, ms since the epoch
-- ARGV[2]  end of the point's period (the job's next point), ms
-- ARGV[3]  owner token for the lease
-- ARGV[4]  lease TTL, ms
-- ARGV[5]  optional: 'now' in ms instead of TIME. Only JobTestScheduler passes it, to
--          drive the same script with explicit ticks; production always uses TIME.
--
-- Returns {outcome, now_ms}; outcome is one of
--   'future'    the point is still ahead of the server clock: refused, nothing written
--   'late'      the clock has reached the next point: refused (no catch-up)
--   'duplicate' the point is not newer than the marker: another trigger had it
--   'overlap'   marker recorded, the lease is held by a running point: consumed, skipped
--   'admitted'  marker recorded and lease taken with ARGV[3]
-- Both keys share one hash tag, so the script runs on one Redis Cluster slot.
local now
if ARGV[5] and ARGV[5] ~= '' then
  now = tonumber(ARGV[5])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local point = tonumber(ARGV[1])
local period_end = tonumber(ARGV[2])
if point > now then
  return {'future', now}
end
if now >= period_end then
  return {'late', now}
end
local marker = tonumber(redis.call('GET', KEYS[1]) or '-1')
if point <= marker then
  return {'duplicate', now}
end
redis.call('SET', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'overlap', now}
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return {'admitted', now}
