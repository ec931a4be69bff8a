-- Store one delayed entry: its payload and its due time, together.
--
-- KEYS[1]  sorted set of due times; KEYS[2] hash of entries
-- ARGV[1]  entry id; ARGV[2] due time in ms; ARGV[3] cjson entry
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1
