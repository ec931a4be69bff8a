-- Put an unacked message back on its queues, at most once.
--
-- KEYS[1]  unacked hash, KEYS[2] unacked index
-- KEYS[3 + 5(i-1) + 1..5] for target i: the queue list, and the fair keys of that list
--          (ring, waiting count, lane lengths, lane heads: fair_lane_parts.lua)
-- ARGV[1]  delivery tag, ARGV[2] message to push (marked redelivered),
-- ARGV[3]  '1' for kombu's "leftmost" (LPUSH: behind the waiting messages, as for a
--          rejected message), '0' for RPUSH (next out, as for an expired one)
-- ARGV[3 + 2(i-1) + 1..2] for target i: 'fair' if the restoring worker consumes the queue
--          fairly ('plain' otherwise), the prefix of the list's lane keys
--
-- On a fair queue (named so, or with tenants on its ring) the message goes straight to
-- the right end of its tenant's lane, next out when its tenant's turn comes, whether
-- it expired or was requeued: through the arrival list it would go behind its tenant's
-- whole backlog. On a plain queue it goes where ARGV[3] says.
--
-- The message leaves the hash in the same step that pushes it, so a restorer killed
-- halfway loses nothing, and of several sweepers racing for one tag only the one whose
-- HDEL succeeds pushes it: no mutex and no WATCH/MULTI retries. Returns 1 when pushed.
-- include: fair_lane_parts

local targets = (#KEYS - 2) / 5
if targets < 1 or targets ~= math.floor(targets) then
  return redis.error_reply('restore needs target lists, five keys each')
end
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local message = ARGV[2]
for i = 1, targets do
  local k = 2 + 5 * (i - 1)
  local q = {
    arrivals = KEYS[k + 1], ring = KEYS[k + 2], waiting = KEYS[k + 3],
    lengths = KEYS[k + 4], heads = KEYS[k + 5], prefix = ARGV[3 + 2 * (i - 1) + 2],
  }
  if ARGV[3 + 2 * (i - 1) + 1] == 'fair' or redis.call('EXISTS', q.ring) == 1 then
    local tenant = tenant_of(message)
    local length = redis.call('RPUSH', q.prefix .. tenant, message)
    redis.call('INCR', q.waiting)
    enlist(q, tenant, length, 1)
    set_head(q, tenant, message)
  elseif ARGV[3] == '1' then
    redis.call('LPUSH', q.arrivals, message)
  else
    redis.call('RPUSH', q.arrivals, message)
  end
end
return 1
