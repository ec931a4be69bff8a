-- Take a slot of a per-key concurrency cap, or say how full it is.
--
-- KEYS[1] sorted set of the key's running jobs: member job id, score lease expiry (ms)
-- ARGV[1] job id, ARGV[2] the cap, ARGV[3] lease ttl in ms
--
-- Time is Redis TIME, so workers with skewed clocks agree on which leases have ended.
-- Leases past their expiry (a worker that died without releasing) are dropped first: a
-- dead worker's slot is free again within the ttl. A job that already holds a slot (its
-- earlier delivery's worker died, the lease has not expired yet) takes it over instead of
-- waiting for itself. The set expires with its longest lease, so an idle key leaves
-- nothing behind.
-- Returns {granted (1/0), now ms, jobs holding a slot after the call}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false then
  if held >= cap then
    return {0, now, held}
  end
  held = held + 1
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {1, now, held}
