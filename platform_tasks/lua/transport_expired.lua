-- Unacked messages taken longer ago than the visibility timeout, with their records.
--
-- KEYS[1]  unacked hash, KEYS[2] unacked index
-- ARGV[1]  visibility timeout in seconds, ARGV[2] maximum number of tags
--
-- Read-only; judged by Redis TIME like the fetch script that wrote the scores.
-- Returns {tags, records}; a record is false when the tag was acked meanwhile.
local now = redis.call('TIME')
local ceiling = tonumber(now[1]) + tonumber(now[2]) / 1000000 - tonumber(ARGV[1])
local tags = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('%.6f', ceiling),
  'LIMIT', 0, tonumber(ARGV[2]))
if #tags == 0 then
  return {tags, {}}
end
return {tags, redis.call('HMGET', KEYS[1], unpack(tags))}
