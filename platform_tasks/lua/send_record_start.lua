-- Note that a notification job is about to send request n (before the request leaves).
-- KEYS[1] the job's send record hash
-- ARGV[1] n, ARGV[2] the record's lifetime in ms, ARGV[3] the job's rendered plan ('' =
-- none: stored once, by the first request that carries one), ARGV[4] now in ms ('' =
-- Redis TIME)
-- Returns the time request n was first tried (ms): this call's, or an earlier try's (a
-- retry keeps the first time, which bounds how long the provider still knows its key).
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local field = 't' .. ARGV[1]
redis.call('HSETNX', KEYS[1], field, now)
if ARGV[3] ~= '' then
  redis.call('HSETNX', KEYS[1], 'plan', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return tonumber(redis.call('HGET', KEYS[1], field))
