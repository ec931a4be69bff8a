-- What a provider response says about its limit, applied to the shared provider bucket.
-- KEYS[1] provider bucket hash
-- ARGV[1] now in ms ('' = Redis TIME), ARGV[2] back off for this many ms ('' = no):
--         a 429 rate_limit_exceeded (retry-after) or ratelimit-remaining 0 (reset);
--         the bucket is emptied: nobody takes a token before now + ARGV[2], then one
--         token is there and the bucket refills at its rate
-- ARGV[3] learned rate per ms ('' = none), ARGV[4] how long the learned rate holds (ms)
-- Either sets the bucket's 'state' flag, which makes rate_limit_take read these fields.
-- Returns the 'until' in force (ms).
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local block = tonumber(ARGV[2])
local until_ms = tonumber(redis.call('HGET', KEYS[1], 'until')) or 0
if block then
  local candidate = now + block
  if candidate > until_ms then
    until_ms = candidate
    redis.call('HSET', KEYS[1], 'until', tostring(until_ms), 'tokens', '1', 'ts', tostring(until_ms),
               'state', '1')
  end
end
local learned = tonumber(ARGV[3])
if learned then
  redis.call('HSET', KEYS[1], 'learned', tostring(learned),
             'learned_until', tostring(now + tonumber(ARGV[4])), 'state', '1')
end
return until_ms
