-- Refresh the unacked timestamps of messages a live worker is still processing.
--
-- KEYS[1]  unacked hash, KEYS[2] unacked index; ARGV delivery tags
--
-- The worker's main process sends this for every message it holds (reserved or
-- running), once per in-flight interval (a quarter of the visibility timeout at most),
-- so a sweeper only sees a message as expired once its worker stopped refreshing it: a
-- real crash. Only tags still recorded are touched (ZADD XX after HEXISTS), so an ack or
-- restore that raced this call is never undone. Returns how many were refreshed.
local now = redis.call('TIME')
local score = string.format('%.6f', tonumber(now[1]) + tonumber(now[2]) / 1000000)
local refreshed = 0
for i = 1, #ARGV do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    refreshed = refreshed + redis.call('ZADD', KEYS[2], 'XX', 'CH', score, ARGV[i])
  end
end
return refreshed
