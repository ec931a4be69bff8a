-- Pause a provider (quota exhausted) until its quota resets; tell the first caller to alert.
-- KEYS[1] pause key, KEYS[2] pause-alerted key
-- ARGV[1] pause length in ms, ARGV[2] reason (daily_quota_exceeded, monthly_quota_exceeded)
-- Returns {1 if this call must alert else 0, remaining pause in ms}.
local ms = tonumber(ARGV[1])
local current = redis.call('PTTL', KEYS[1])
if current < ms then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ms)
  current = ms
end
local first = redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', current)
if first then
  return {1, current}
end
return {0, current}
