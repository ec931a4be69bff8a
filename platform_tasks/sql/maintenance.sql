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
