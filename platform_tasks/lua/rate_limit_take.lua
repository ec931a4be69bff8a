-- Take tokens from a provider bucket (requests) and a tenant bucket (messages): both or none.
-- KEYS[1] provider bucket hash, KEYS[2] provider pause key, KEYS[3] tenant bucket hash
--         (optional: absent when tenants are unlimited)
-- ARGV[1] now in ms ('' = Redis TIME), ARGV[2] provider rate in tokens per ms,
-- ARGV[3] requests to take, ARGV[4] tenant rate per ms ('' = unlimited), ARGV[5] messages,
-- ARGV[6] burst in ms (a full bucket holds rate * burst tokens, at least 1)
-- Returns {1, 0, ''} when granted, else {0, wait_ms, reason}.
-- A cost above the capacity is granted from a full bucket and leaves it in debt, so a
-- 100-message batch still passes a 10-message bucket at the bucket's long-run rate.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local burst = tonumber(ARGV[6])

local paused = redis.call('PTTL', KEYS[2])
if paused > 0 then
  return {0, paused, 'provider_paused'}
end

local function refill(key, rate, floor_ts)
  local v = redis.call('HMGET', key, 'tokens', 'ts')
  local cap = math.max(1, rate * burst)
  local tokens = tonumber(v[1])
  local ts = tonumber(v[2])
  if not tokens then
    tokens = cap
    ts = now
  end
  if floor_ts and ts < floor_ts then ts = floor_ts end
  if now > ts then tokens = math.min(cap, tokens + (now - ts) * rate) end
  return tokens, cap
end

local function wait_for(tokens, cost, cap, rate)
  local need = math.min(cost, cap)
  if tokens >= need then return 0 end
  return math.ceil((need - tokens) / rate)
end

-- provider: a 429 set 'until'; the provider's headers may have taught a lower rate
local p = redis.call('HMGET', KEYS[1], 'until', 'learned', 'learned_until')
local until_ms = tonumber(p[1]) or 0
if now < until_ms then
  return {0, until_ms - now, 'provider_backoff'}
end
local prate = tonumber(ARGV[2])
local learned = tonumber(p[2])
if learned and (tonumber(p[3]) or 0) > now and learned < prate then prate = learned end
local requests = tonumber(ARGV[3])
local ptokens, pcap = refill(KEYS[1], prate, until_ms)
local wait = wait_for(ptokens, requests, pcap, prate)
local reason = ''
if wait > 0 then reason = 'provider_rate_limit' end

local trate = tonumber(ARGV[4])
local messages = tonumber(ARGV[5])
local ttokens, tcap
if trate and KEYS[3] then
  ttokens, tcap = refill(KEYS[3], trate, nil)
  local twait = wait_for(ttokens, messages, tcap, trate)
  if twait > wait then
    wait = twait
    reason = 'tenant_rate_limit'
  end
end
if wait > 0 then
  return {0, wait, reason}
end

ptokens = ptokens - requests
redis.call('HSET', KEYS[1], 'tokens', tostring(ptokens), 'ts', tostring(now))
if trate and KEYS[3] then
  ttokens = ttokens - messages
  redis.call('HSET', KEYS[3], 'tokens', tostring(ttokens), 'ts', tostring(now))
  -- a full bucket is the same as no bucket: let it expire once it has refilled
  redis.call('PEXPIRE', KEYS[3], math.ceil((tcap - ttokens) / trate) + 1000)
end
return {1, 0, ''}
