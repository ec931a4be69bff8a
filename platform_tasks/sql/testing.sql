-- name: platform_tables
-- The tables of schema core a test starts without rows (the migration bookkeeping stays).
SELECT format('%I.%I', schemaname, tablename)
FROM pg_tables
WHERE schemaname = 'core' AND tablename <> 'schema_migrations'
ORDER BY tablename

-- name: processed_at
-- When a consumer's idempotency row for a job was written (no row: never applied).
SELECT processed_at FROM core.processed_jobs WHERE job_id = %(job_id)s AND consumer = %(consumer)s

-- name: dead_letter_row
-- One dead letter by id, every column, as a test inspects it.
SELECT id, job_id, queue, kind, tenant_id, payload, attempts, last_error, error_type, reason,
       status, correlation_id, created_at, updated_at, replay_count, replayed_at,
       discard_reason, discarded_at
FROM core.dead_letters WHERE id = %(id)s
