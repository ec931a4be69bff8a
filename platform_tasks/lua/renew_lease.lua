-- Renew a running lease if, and only if, the caller still owns it.
--
-- KEYS[1]  lease key
-- ARGV[1]  owner token
-- ARGV[2]  new TTL, ms
-- ARGV[3]  deadline, ms since the epoch, or 0: refuse once Redis TIME reaches it
-- ARGV[4]  '1' to take the lease back when it has expired (start of a queued run), else '0'
-- ARGV[5]  optional: 'now' in ms instead of TIME (JobTestScheduler's explicit ticks only)
--
-- Returns {outcome, now_ms}: 'renewed', 'late' (deadline reached; the lease is released
-- when owned), or 'lost' (someone else holds it, or it expired and ARGV[4] is '0').
local now
if ARGV[5] and ARGV[5] ~= '' then
  now = tonumber(ARGV[5])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local deadline = tonumber(ARGV[3])
local holder = redis.call('GET', KEYS[1])
if deadline > 0 and now >= deadline then
  if holder == ARGV[1] then
    redis.call('DEL', KEYS[1])
  end
  return {'late', now}
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'renewed', now}
end
if (not holder) and ARGV[4] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {'renewed', now}
end
return {'lost', now}
