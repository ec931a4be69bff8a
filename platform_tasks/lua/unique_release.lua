-- Release a unique publish key if it still belongs to this job.
-- KEYS[1] the lock; ARGV[1] the job id. Returns 1 released, 0 not this job's (or gone).
local lock = redis.call('GET', KEYS[1])
if lock and string.sub(lock, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
