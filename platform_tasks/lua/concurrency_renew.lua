-- Renew the lease of a running job to ttl from now (Redis TIME).
--
-- KEYS[1] the key's sorted set of running jobs; ARGV[1] ttl in ms; ARGV[2] the job id.
-- A lease that is gone (it expired: the renewal came too late) is not taken back, since
-- its slot may be another job's by now. Returns 1 renewed, 0 gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local score = redis.call('ZSCORE', KEYS[1], ARGV[2])
if score == false or tonumber(score) <= now then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[2])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
