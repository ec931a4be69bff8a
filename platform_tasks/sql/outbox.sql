-- Queries of the transactional outbox, loaded by name by platform_tasks.publishing.outbox
-- (the write, in the publisher's transaction) and platform_tasks.publishing.outbox_relay.

-- name: insert_row
-- One finished message, in the caller's transaction.
INSERT INTO core.outbox (profile, broker, job_id, queue, target, message, entry_id, due_ms)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)

-- name: insert_rows
-- Many finished messages (schedule_many), in the caller's transaction; execute_values
-- fills the VALUES list a page of rows at a time.
INSERT INTO core.outbox (profile, broker, job_id, queue, target, message, entry_id, due_ms)
VALUES %s

-- name: listen
-- The channel the insert trigger notifies at commit (migration 0009).
LISTEN platform_outbox

-- name: claim_begin
-- Sent with claim_batch in one round trip: the claim's transaction, and a plan that takes
-- the rows in index order. The table churns faster than autovacuum's statistics follow:
-- planned from statistics that say it is nearly empty, a batch becomes a sequential scan
-- or bitmap scan and a sort of every row (and dead row) left, each time; the index on
-- (profile, id) gives the order and the limit.
BEGIN;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off

-- name: claim_batch
-- Take the oldest committed rows of this profile no other relay holds, deleting them in
-- a transaction that commits only once the broker accepted them (commit_batch): a relay
-- that dies or fails before that rolls the delete back, and the rows are there for the
-- next one. SKIP LOCKED: concurrent relays take disjoint batches. One write per row
-- (the delete), one statement. The rows come back in no particular order; the relay
-- sorts them by id (publish order) itself, cheaper than a sort here, which would copy
-- every message twice more.
-- The delete finds its rows by their ctid (a TID scan, whatever the statistics say): by
-- id, a plan from "nearly empty" statistics walks the whole (profile, id) index and
-- compares every row waiting with the batch's ids, for every batch. ARRAY(...) runs the
-- inner index scan once; the rows are locked by it and never updated, so their ctids
-- stay theirs until the delete.
DELETE FROM core.outbox
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM core.outbox
    WHERE profile = %s
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
))
RETURNING id, broker, queue, target, message, entry_id, due_ms

-- name: commit_batch
-- Every row of the batch was accepted by the broker.
COMMIT

-- name: delete_rows
-- Some rows of a batch were not accepted (a RabbitMQ nack or return): the batch's delete
-- was rolled back, and only the accepted rows are deleted, on their own.
DELETE FROM core.outbox WHERE id = ANY(%s)

-- name: waiting_for_queue
-- Committed rows of this profile on their way to a queue, due now (fan-out back-pressure
-- counts them with the queue's depth). The outbox holds a few batches while its relays
-- keep up, so the scan of this profile's rows it makes is short.
SELECT count(*) FROM core.outbox
WHERE profile = %s AND queue = %s AND (due_ms IS NULL OR due_ms <= %s)

-- name: measure
-- Rows waiting and the age in seconds of the oldest one (NULL: none), by the server clock.
SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
FROM core.outbox
WHERE profile = %s
