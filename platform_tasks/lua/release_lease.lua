-- Release a running lease only when the caller owns it (never someone else's).
--
-- KEYS[1]  lease key
-- ARGV[1]  owner token
-- Returns 1 when released, 0 when the lease was gone or held by another owner.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
