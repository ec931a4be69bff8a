-- Take tokens from a provider bucket (requests) and a tenant bucket (messages): both or none.
-- KEYS[1] provider bucket hash, KEYS[2] tenant bucket hash (optional: absent when
--         tenants are unlimited)
-- ARGV[1] now in ms ('' = Redis TIME), ARGV[2] provider rate in tokens per ms,
-- ARGV[3] requests to take, ARGV[4] tenant rate per ms ('' = unlimited), ARGV[5] messages,
-- ARGV[6] provider capacity, ARGV[7] tenant capacity (tokens a full bucket holds),
-- ARGV[8] headroom: provider tokens this caller must leave in the bucket (the marketing
--         rail leaves some for transactional sends; transactional passes 0),
-- ARGV[9] the caller's queue of refused callers ('t' transactional, 'm' marketing),
-- ARGV[10] ms: marketing keeps the headroom only while a transactional call came within
--         this long (field 'tt' of the provider bucket, written by transactional calls),
-- ARGV[11] ms (optional, '' or absent = 0): a caller refused by the provider bucket's rate
--         whose slot among the other in-place waiters (field 'next_w') comes within this
--         long is told to wait for it where it is (reason 5) instead of being queued
--         behind the refused callers of its rail; the dispatcher passes it for
--         transactional sends only.
-- ARGV[12] ms (optional, '' or absent = 1000): the span of the sliding second below; a
--         task throttle passes a little more, so its handlers, which start a few ms after
--         their grants, also never start more than the rate's count within any 1000 ms.
-- A rate learned from the provider's headers scales the capacity down with it.
-- Returns 0 when granted, else wait_ms * 8 + reason (1 provider_paused, 2 provider_backoff,
-- 3 provider_rate_limit, 4 tenant_rate_limit, 5 provider_rate_wait: wait in place, then ask
-- again): one integer is the cheapest reply to read.
-- A refused caller is given a slot after the callers of its rail refused before it
-- (field 'next_<rail>' of the bucket that refused): a thousand jobs refused at once come
-- back spread over the time their tokens need, not all at once to be refused again.
-- A cost above the capacity is granted from a full bucket and leaves it in debt, so a
-- 100-message batch still passes a 10-message bucket at the bucket's long-run rate.
--
-- The common call is a grant with nothing unusual in force, so that path reads two fields
-- per bucket plus the provider's 'state' flag, and nothing else: the flag is set by
-- rate_limit_observe/rate_limit_pause whenever a back-off, a learned rate or a pause is
-- stored, and removed here once none of them is in force any more. A tenant bucket's
-- expiry is renewed only when the one set before ('exp') would end less than half a
-- second after the bucket is full again.
local now = tonumber(ARGV[1])
local p = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'state', 'tt', 'gi')
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local prate = tonumber(ARGV[2])
local pcap = tonumber(ARGV[6])
local requests = tonumber(ARGV[3])
local until_ms = 0
if p[3] then
  local s = redis.call('HMGET', KEYS[1], 'until', 'learned', 'learned_until', 'paused_until')
  local paused_until = tonumber(s[4]) or 0
  if paused_until > now then
    return math.max(1, paused_until - now) * 8 + 1
  end
  until_ms = tonumber(s[1]) or 0
  local learned = tonumber(s[2])
  local learned_until = tonumber(s[3]) or 0
  if learned and learned_until > now then
    if learned < prate then
      pcap = math.max(1, math.floor(pcap * learned / prate))
      prate = learned
    end
  elseif until_ms <= now then
    redis.call('HDEL', KEYS[1], 'state')
  end
end

local transactional = ARGV[9] == 't'

local in_place = tonumber(ARGV[11]) or 0

local function reserve(key, wait, cost, rate, reason)
  if transactional then redis.call('HSET', KEYS[1], 'tt', now) end
  if reason == 3 and in_place > 0 then
    -- in-place waiters are spaced one token apart among themselves, so a few refused at
    -- once do not all wake for the same token
    local slot = now + wait
    local queued = tonumber(redis.call('HGET', key, 'next_w')) or 0
    if queued > slot then slot = queued end
    if slot - now <= in_place then
      redis.call('HSET', key, 'next_w', tostring(slot + cost / rate))
      return math.max(1, math.ceil(slot - now)) * 8 + 5
    end
  end
  local field = 'next_' .. ARGV[9]
  local slot = now + wait
  local queued = tonumber(redis.call('HGET', key, field)) or 0
  if queued > slot then slot = queued end
  redis.call('HSET', key, field, tostring(slot + cost / rate))
  return math.max(1, math.ceil(slot - now)) * 8 + reason
end

if now < until_ms then
  return reserve(KEYS[1], until_ms - now, requests, prate, 2)
end
local headroom = tonumber(ARGV[8])
if headroom > pcap - 1 then headroom = 0 end
-- No transactional call for a while: marketing may use the whole bucket. A bucket that
-- must stay partly unused drains paced marketing sends only when each finds it full,
-- which jitter of a millisecond defeats.
if headroom > 0 and now - (tonumber(p[4]) or 0) > tonumber(ARGV[10]) then headroom = 0 end
-- refill (a bucket never seen is full); after a back-off 'ts' is its 'until' already
local ptokens = tonumber(p[1])
if ptokens then
  local elapsed = now - tonumber(p[2])
  if elapsed > 0 then
    ptokens = ptokens + elapsed * prate
    if ptokens > pcap then ptokens = pcap end
  end
else
  ptokens = pcap
end
local pneed = requests + headroom
if pneed > pcap then pneed = pcap end
local wait = 0
if ptokens < pneed then wait = math.ceil((pneed - ptokens) / prate) end
-- The sliding second: a provider that counts requests per second must never be granted
-- more than the rate's count (48 at 48/s) within any 1000 ms, burst or not, so the trip
-- to it keeps the slack between the setting and its limit for jitter. Fields g0..g<n-1>
-- of the bucket keep the last n grant times, 'gi' points at the oldest (one entry per
-- take). A learned rate changes n: the ring is then briefly out of order, which only
-- moves a few grants by less than a second.
local window_n = math.floor(prate * 1000 + 1e-9)
local window_ms = tonumber(ARGV[12]) or 1000
local gi = tonumber(p[5]) or 0
if window_n >= 1 then
  if gi >= window_n then gi = 0 end
  local oldest = tonumber(redis.call('HGET', KEYS[1], 'g' .. gi))
  if oldest and oldest > now - window_ms then
    local window_wait = oldest + window_ms - now
    if window_wait > wait then wait = window_wait end
  end
end

local trate = tonumber(ARGV[4])
if trate and KEYS[2] then
  local messages = tonumber(ARGV[5])
  local tcap = tonumber(ARGV[7])
  local t = redis.call('HMGET', KEYS[2], 'tokens', 'ts', 'exp')
  local ttokens = tonumber(t[1])
  if ttokens then
    local elapsed = now - tonumber(t[2])
    if elapsed > 0 then
      ttokens = ttokens + elapsed * trate
      if ttokens > tcap then ttokens = tcap end
    end
  else
    ttokens = tcap
  end
  local tneed = messages
  if tneed > tcap then tneed = tcap end
  if ttokens < tneed then
    local twait = math.ceil((tneed - ttokens) / trate)
    if twait > wait then
      return reserve(KEYS[2], twait, tneed, trate, 4)
    end
  end
  if wait > 0 then
    return reserve(KEYS[1], wait, requests, prate, 3)
  end
  ttokens = ttokens - messages
  -- a full bucket is the same as no bucket: let it expire once it has refilled
  local full_at = now + math.ceil((tcap - ttokens) / trate) + 1000
  if (tonumber(t[3]) or 0) < full_at - 500 then
    redis.call('HSET', KEYS[2], 'tokens', tostring(ttokens), 'ts', now, 'exp', full_at)
    redis.call('PEXPIRE', KEYS[2], full_at - now)
  else
    redis.call('HSET', KEYS[2], 'tokens', tostring(ttokens), 'ts', now)
  end
elseif wait > 0 then
  return reserve(KEYS[1], wait, requests, prate, 3)
end
if window_n >= 1 then
  redis.call('HSET', KEYS[1], 'g' .. gi, now, 'gi', (gi + 1) % window_n)
end
if transactional then
  redis.call('HSET', KEYS[1], 'tokens', tostring(ptokens - requests), 'ts', now, 'tt', now)
else
  redis.call('HSET', KEYS[1], 'tokens', tostring(ptokens - requests), 'ts', now)
end
return 0
