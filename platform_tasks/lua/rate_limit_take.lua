-- Take tokens from a provider bucket (requests) and a tenant bucket (messages): both or none.
-- KEYS[1] provider bucket hash, KEYS[2] tenant bucket hash (optional: absent when
--         tenants are unlimited)
-- ARGV[1] now in ms ('' = Redis TIME), ARGV[2] provider rate in tokens per ms,
-- ARGV[3] requests to take, ARGV[4] tenant rate per ms ('' = unlimited), ARGV[5] messages,
-- ARGV[6] provider capacity, ARGV[7] tenant capacity (tokens a full bucket holds),
-- ARGV[8] headroom: provider tokens this caller must leave in the bucket (the marketing
--         rail leaves some for transactional sends; transactional passes 0),
-- ARGV[9] the caller's queue of refused callers ('t' transactional, 'm' marketing).
-- A rate learned from the provider's headers scales the capacity down with it.
-- Returns 0 when granted, else wait_ms * 8 + reason (1 provider_paused, 2 provider_backoff,
-- 3 provider_rate_limit, 4 tenant_rate_limit): one integer is the cheapest reply to read.
-- A refused caller is given a slot after the callers of its rail refused before it
-- (field 'next_<rail>' of the bucket that refused): a thousand jobs refused at once come
-- back spread over the time their tokens need, not all at once to be refused again.
-- A cost above the capacity is granted from a full bucket and leaves it in debt, so a
-- 100-message batch still passes a 10-message bucket at the bucket's long-run rate.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local headroom = tonumber(ARGV[8]) or 0
local queue_field = 'next_' .. (ARGV[9] or 't')

local function refill(tokens, ts, rate, cap, floor_ts)
  tokens = tonumber(tokens)
  ts = tonumber(ts)
  if not tokens then
    tokens = cap
    ts = now
  end
  if floor_ts and ts < floor_ts then ts = floor_ts end
  if now > ts then tokens = math.min(cap, tokens + (now - ts) * rate) end
  return tokens
end

local function wait_for(tokens, need, rate)
  if tokens >= need then return 0 end
  return math.ceil((need - tokens) / rate)
end

local function reserve(key, wait, cost, rate, reason)
  local slot = now + wait
  local queued = tonumber(redis.call('HGET', key, queue_field)) or 0
  if queued > slot then slot = queued end
  redis.call('HSET', key, queue_field, tostring(slot + cost / rate))
  return math.max(1, math.ceil(slot - now)) * 8 + reason
end

-- provider: a quota pause, a 429's 'until', maybe a lower rate taught by its headers
local p = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'until', 'learned', 'learned_until',
                     'paused_until')
local paused_until = tonumber(p[6]) or 0
if paused_until > now then
  return math.max(1, paused_until - now) * 8 + 1
end
local until_ms = tonumber(p[3]) or 0
local prate = tonumber(ARGV[2])
local pcap = tonumber(ARGV[6])
local learned = tonumber(p[4])
if learned and (tonumber(p[5]) or 0) > now and learned < prate then
  pcap = math.max(1, math.floor(pcap * learned / prate))
  prate = learned
end
if headroom > pcap - 1 then headroom = 0 end
local requests = tonumber(ARGV[3])
if now < until_ms then
  return reserve(KEYS[1], until_ms - now, requests, prate, 2)
end
local ptokens = refill(p[1], p[2], prate, pcap, until_ms)
local pneed = math.min(requests + headroom, pcap)
local wait = wait_for(ptokens, pneed, prate)

local trate = tonumber(ARGV[4])
local messages = tonumber(ARGV[5])
local ttokens
local tcap = tonumber(ARGV[7])
if trate and KEYS[2] then
  local t = redis.call('HMGET', KEYS[2], 'tokens', 'ts')
  ttokens = refill(t[1], t[2], trate, tcap, nil)
  local twait = wait_for(ttokens, math.min(messages, tcap), trate)
  if twait > wait then
    return reserve(KEYS[2], twait, math.min(messages, tcap), trate, 4)
  end
end
if wait > 0 then
  return reserve(KEYS[1], wait, requests, prate, 3)
end

ptokens = ptokens - requests
redis.call('HSET', KEYS[1], 'tokens', tostring(ptokens), 'ts', tostring(now))
if trate and KEYS[2] then
  ttokens = ttokens - messages
  redis.call('HSET', KEYS[2], 'tokens', tostring(ttokens), 'ts', tostring(now))
  -- a full bucket is the same as no bucket: let it expire once it has refilled
  redis.call('PEXPIRE', KEYS[2], math.ceil((tcap - ttokens) / trate) + 1000)
end
return 0
