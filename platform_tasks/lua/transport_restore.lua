-- Put an unacked message back on its queue lists, at most once.
--
-- KEYS[1]  unacked hash, KEYS[2] unacked index, KEYS[3..] target queue lists
-- ARGV[1]  delivery tag, ARGV[2] message to push (marked redelivered),
-- ARGV[3]  '1' for kombu's "leftmost" (LPUSH: behind the waiting messages, as for a
--          rejected message), '0' for RPUSH (next out, as for an expired one)
--
-- The message leaves the hash in the same step that pushes it, so a restorer killed
-- halfway loses nothing, and of several sweepers racing for one tag only the one whose
-- HDEL succeeds pushes it: no mutex and no WATCH/MULTI retries. Returns 1 when pushed.
if #KEYS < 3 then
  return redis.error_reply('restore needs at least one target list')
end
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
for i = 3, #KEYS do
  if ARGV[3] == '1' then
    redis.call('LPUSH', KEYS[i], ARGV[2])
  else
    redis.call('RPUSH', KEYS[i], ARGV[2])
  end
end
return 1
