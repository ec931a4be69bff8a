-- Queries of job status (platform_tasks.jobs_status): what PostgreSQL knows about a job or
-- about the jobs of one correlation id. Each is one indexed read.

-- name: record_output
-- The handler's return value on the job's claimed row, in the job's transaction.
UPDATE core.processed_jobs SET output = %(output)s::jsonb
WHERE job_id = %(job_id)s AND consumer = %(consumer)s

-- name: read_outputs
-- Recorded outputs of many jobs (batch callbacks, jobs show).
SELECT job_id, consumer, output FROM core.processed_jobs
WHERE job_id = ANY(%(job_ids)s::uuid[]) AND output IS NOT NULL

-- name: processed_by_job
-- The consumers that applied the job (committed claims only: a running job's claim is
-- not visible until it commits). A cancelled job's claim is here too, with its dead letter.
SELECT job_id, consumer, processed_at, output, correlation_id FROM core.processed_jobs
WHERE job_id = %(job_id)s ORDER BY processed_at

-- name: processed_by_correlation
SELECT job_id, consumer, processed_at, output, correlation_id FROM core.processed_jobs
WHERE correlation_id = %(correlation_id)s ORDER BY processed_at
LIMIT %(limit)s

-- name: dead_letters_by_job
-- Newest first: a replayed job that failed again has one row per generation.
SELECT job_id, id, reason, status, queue, kind, tenant_id, attempts, error_type,
       discard_reason, created_at, replayed_at, correlation_id, payload
FROM core.dead_letters WHERE job_id = %(job_id)s ORDER BY id DESC

-- name: dead_letters_by_correlation
SELECT job_id, id, reason, status, queue, kind, tenant_id, attempts, error_type,
       discard_reason, created_at, replayed_at, correlation_id, payload
FROM core.dead_letters WHERE correlation_id = %(correlation_id)s ORDER BY id DESC
LIMIT %(limit)s

-- name: outbox_by_job
-- Rows not yet relayed (the relay deletes a row once the broker has its message). No
-- index on job_id: the outbox holds only what the relays have not caught up with.
SELECT job_id, id, queue, broker, due_ms, created_at FROM core.outbox
WHERE profile = %(profile)s AND job_id = %(job_id)s

-- name: outbox_by_correlation
-- The correlation id is in each row's message: Celery's argsrepr header of a wire message
-- (JSON-escaped once, twice in a delayed Redis entry that holds the wire message as a
-- string), a unique publish's payload. This finds the rows that hold its text in any of
-- those spellings; the caller keeps those whose message carries it whole
-- (platform_tasks.jobs_status.outbox_rows). No index: the outbox holds only what the
-- relays have not caught up with.
SELECT job_id, id, queue, broker, due_ms, created_at, message FROM core.outbox
WHERE profile = %(profile)s
  AND (strpos(message, %(correlation_id)s) > 0 OR strpos(message, %(escaped)s) > 0
       OR strpos(message, %(escaped_twice)s) > 0)
ORDER BY id LIMIT %(limit)s

-- name: operation
-- The operation that cancelled a job: who ran it and when.
SELECT id, kind, actor, started_at FROM core.operations WHERE id = %(id)s
