-- Store a delayed job under a unique publish key, or find the job already waiting.
--
-- KEYS[1] the unique key's lock (value "<job id> <entry id>"), KEYS[2] the delay store's
--         sorted set, KEYS[3] its hash of entries, KEYS[4] its set of claimed entry ids
-- ARGV[1] mode: 'skip' (a waiting job wins: nothing stored) or 'debounce' (a waiting job
--         keeps its id and due time, its entry is replaced by this one)
-- ARGV[2] job id, ARGV[3] entry id, ARGV[4] due ms ('' = now by Redis TIME + ARGV[7]),
-- ARGV[5] lock ttl in ms, ARGV[6] the encoded entry,
-- ARGV[7] delay in ms when ARGV[4] is '', ARGV[8] the lock value the caller built its
--         entry for ('' = none: a new job)
-- Returns {outcome, lock value}: outcome 'stored' (a new job), 'exists' (skip: the
-- waiting job's lock returned), 'replaced' (debounce: the waiting entry now holds this
-- data), 'rebuild' (debounce: the lock is not the one the entry was built for; build it
-- again for the lock returned).
local lock = redis.call('GET', KEYS[1])
local waiting = false
if lock then
  local entry_id = string.match(lock, ' (.*)$')
  -- a lock whose entry left the store (promoted, started) still holds a skip, for as
  -- long as the job has not started; a debounce has nothing left to replace. An entry a
  -- promoter has claimed (claim_delays.lua) is leaving: its data is being published under
  -- the waiting job's id and the promoter removes the entry once confirmed, so replacing
  -- its data would lose it; a debounce stores a new job instead, as after promotion.
  if ARGV[1] == 'skip' then
    return {'exists', lock}
  end
  if entry_id and entry_id ~= '' and redis.call('HEXISTS', KEYS[3], entry_id) == 1
      and redis.call('SISMEMBER', KEYS[4], entry_id) == 0 then
    waiting = entry_id
  end
end
if waiting then
  if ARGV[8] ~= lock then
    return {'rebuild', lock}
  end
  redis.call('HSET', KEYS[3], waiting, ARGV[6])
  return {'replaced', lock}
end
if ARGV[8] ~= '' then
  return {'rebuild', ''}
end
local due = tonumber(ARGV[4])
if not due then
  local t = redis.call('TIME')
  due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[7])
end
local value = ARGV[2] .. ' ' .. ARGV[3]
redis.call('SET', KEYS[1], value, 'PX', ARGV[5])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[6])
redis.call('ZADD', KEYS[2], due, ARGV[3])
return {'stored', value}
