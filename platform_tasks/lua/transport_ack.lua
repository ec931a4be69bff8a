-- Forget an unacked message: the ack of kombu's Redis transport as one script.
--
-- KEYS[1]  unacked hash, KEYS[2] unacked index; ARGV[1] delivery tag
--
-- Stock kombu runs the same two commands in a MULTI/EXEC pipeline; one script is one
-- round trip and equally atomic. Returns 1 when the message was still recorded.
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
