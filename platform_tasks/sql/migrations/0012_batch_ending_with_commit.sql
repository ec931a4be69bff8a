-- Batches: a child's ending sent in the round trip of its transaction's COMMIT. The
-- ending runs after a savepoint and, when it brings a shard to zero, raises this error
-- (SQLSTATE PTB01) instead of returning: the COMMIT after it in the same round trip is
-- then not run, the consumer rolls back to the savepoint (the handler's work kept), and
-- counts the ending again the ordinary way, where the last ending fires the callbacks
-- before its own commit. Only about one child per shard ever takes that way.
CREATE OR REPLACE FUNCTION core.batch_shard_emptied(batch uuid) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a shard of batch % reached zero: its completion is checked before the commit',
        batch USING ERRCODE = 'PTB01';
END
$$;
