-- Pause a provider (quota exhausted) until its quota resets; tell the first caller to alert.
-- KEYS[1] provider bucket hash (field 'paused_until', ms), KEYS[2] pause-alerted key
-- ARGV[1] now in ms ('' = Redis TIME), ARGV[2] pause length in ms,
-- ARGV[3] reason (daily_quota_exceeded, monthly_quota_exceeded)
-- Returns {1 if this call must alert else 0, remaining pause in ms}. A shorter pause
-- never shortens a longer one; the alert key lives as long as the pause, so the next
-- pause alerts again.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local ms = tonumber(ARGV[2])
local paused_until = tonumber(redis.call('HGET', KEYS[1], 'paused_until')) or 0
if paused_until < now + ms then
  paused_until = now + ms
  redis.call('HSET', KEYS[1], 'paused_until', tostring(paused_until), 'pause_reason', ARGV[3],
             'state', '1')
end
local remaining = paused_until - now
local first = redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', remaining)
if first then
  return {1, remaining}
end
return {0, remaining}
