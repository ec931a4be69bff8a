-- Housekeeping queries, loaded by name by platform_tasks.maintenance.

-- name: purge_processed_jobs_batch
-- At most %(batch_size)s idempotency rows older than the cutoff, in one short transaction.
-- Rows are addressed by ctid and locked with SKIP LOCKED, so the delete never waits on a
-- row a consumer holds, and a consumer inserting new rows never waits on the delete.
DELETE FROM core.processed_jobs
WHERE ctid = ANY(ARRAY(
    SELECT ctid
    FROM core.processed_jobs
    WHERE processed_at < %(cutoff)s
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
));

-- name: purge_delivery_marks_batch
-- At most %(batch_size)s delivery marks older than the cutoff (the same as the idempotency
-- rows'): a mark only says the job's delivery state is in Redis, which lives hours, so a
-- mark past the idempotency window marks nothing. Same ctid + SKIP LOCKED batching.
DELETE FROM core.delivery_marks
WHERE ctid = ANY(ARRAY(
    SELECT ctid
    FROM core.delivery_marks
    WHERE marked_at < %(cutoff)s
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
));

-- name: purge_batches_batch
-- At most %(batch_size)s batches that completed before the cutoff (the idempotency rows')
-- and made no progress since (a replay re-opening one moves progressed_at): their shards
-- and children go with them (ON DELETE CASCADE). A batch still open is never purged,
-- however old. A batch holds up to thousands of child rows, hence few per transaction.
DELETE FROM core.batches
WHERE batch_id = ANY(ARRAY(
    SELECT batch_id
    FROM core.batches
    WHERE complete_fired_at < %(cutoff)s AND progressed_at < %(cutoff)s
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
));
