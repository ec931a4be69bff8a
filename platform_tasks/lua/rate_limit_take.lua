-- Take tokens from a provider bucket (requests) and a tenant bucket (messages): both or none.
-- KEYS[1] provider bucket hash, KEYS[2] the provider's slots held by refused callers
--         (sorted set: member -> due ms), KEYS[3] tenant bucket hash (optional: absent
--         when tenants are unlimited)
-- ARGV[1] now in ms ('' = Redis TIME), ARGV[2] provider rate in tokens per ms,
-- ARGV[3] requests to take, ARGV[4] tenant rate per ms ('' = unlimited), ARGV[5] messages,
-- ARGV[6] provider capacity, ARGV[7] tenant capacity (tokens a full bucket holds),
-- ARGV[8] headroom: provider tokens this caller must leave in the bucket (the marketing
--         rail leaves some for transactional sends; transactional passes 0),
-- ARGV[9] the caller's queue of refused callers ('t' transactional, 'm' marketing),
-- ARGV[10] the longest wait in ms the caller will spend in its own process for tokens
--         that are short ('' or 0: none): such a caller is not refused but given the
--         tokens now, due at now + the wait (both buckets go into debt by them, so every
--         later caller waits behind it), and sends once that time has come,
-- ARGV[11] the caller's name for a held slot ('' = none), ARGV[12] how far ahead a slot
--         may be held (ms): a caller refused by the provider bucket within that horizon
--         takes its tokens now and holds the slot they are due at under its name
--         (reason 6); called again under that name it is granted without taking tokens
--         again (at the slot, up to ARGV[10] early, or up to 1 s late; later than that
--         the slot has lapsed and it takes tokens like any caller). So a refused and
--         rescheduled send is refused once, not again by callers that arrived after it.
-- A rate learned from the provider's headers scales the capacity down with it.
-- Returns 0 when granted, wait_ms * 8 + 5 when granted for now + wait_ms (ARGV[10]), else
-- wait_ms * 8 + reason (1 provider_paused, 2 provider_backoff, 3 provider_rate_limit,
-- 4 tenant_rate_limit, 6 provider_slot_held): one integer is the cheapest reply to read.
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
local p = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'state', 'held')
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

local function reserve(key, wait, cost, rate, reason)
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
local reserve_ms = tonumber(ARGV[10]) or 0
local member = ARGV[11]
if member == '' then member = nil end
if member and (tonumber(p[4]) or 0) > 0 then
  local slot = tonumber(redis.call('ZSCORE', KEYS[2], member))
  if slot then
    local early = slot - now
    if early > reserve_ms then return math.ceil(early) * 8 + 6 end
    redis.call('ZREM', KEYS[2], member)
    redis.call('HINCRBY', KEYS[1], 'held', -1)
    if early >= -1000 then
      if early > 0 then return math.ceil(early) * 8 + 5 end
      return 0
    end
  end
end
local headroom = tonumber(ARGV[8])
if headroom > pcap - 1 then headroom = 0 end
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

local trate = tonumber(ARGV[4])
local horizon = tonumber(ARGV[12]) or 0
if trate and KEYS[3] then
  local messages = tonumber(ARGV[5])
  local tcap = tonumber(ARGV[7])
  local t = redis.call('HMGET', KEYS[3], 'tokens', 'ts', 'exp')
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
      if twait > reserve_ms then
        return reserve(KEYS[3], twait, tneed, trate, 4)
      end
      wait = twait
    end
  end
  if wait > reserve_ms and not (member and wait <= horizon) then
    return reserve(KEYS[1], wait, requests, prate, 3)
  end
  ttokens = ttokens - messages
  -- a full bucket is the same as no bucket: let it expire once it has refilled
  local full_at = now + math.ceil((tcap - ttokens) / trate) + 1000
  if (tonumber(t[3]) or 0) < full_at - 500 then
    redis.call('HSET', KEYS[3], 'tokens', tostring(ttokens), 'ts', now, 'exp', full_at)
    redis.call('PEXPIRE', KEYS[3], full_at - now)
  else
    redis.call('HSET', KEYS[3], 'tokens', tostring(ttokens), 'ts', now)
  end
elseif wait > reserve_ms and not (member and wait <= horizon) then
  return reserve(KEYS[1], wait, requests, prate, 3)
end
if wait > reserve_ms then
  -- held for member: the tokens are taken now, due at now + wait; slots older than ten
  -- minutes belong to callers that never came back and are dropped
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 600000)
  redis.call('ZADD', KEYS[2], now + wait, member)
  redis.call('HSET', KEYS[1], 'tokens', tostring(ptokens - requests), 'ts', now,
             'held', redis.call('ZCARD', KEYS[2]))
  return wait * 8 + 6
end
redis.call('HSET', KEYS[1], 'tokens', tostring(ptokens - requests), 'ts', now)
if wait > 0 then return wait * 8 + 5 end
return 0
