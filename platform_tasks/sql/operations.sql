-- Queries of the bulk dead-letter operations, loaded by name by
-- platform_tasks.operations.bulk. Every filter is optional (NULL means "any");
-- since is inclusive, until exclusive, both on created_at.

-- name: count_matching
SELECT count(*), max(id)
FROM core.dead_letters
WHERE status = 'pending_review'
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(error_type)s::text IS NULL OR error_type = %(error_type)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s);

-- name: sample_matching
-- The oldest matching rows, without payload, last_error cut: what a preview shows.
SELECT id, job_id, queue, kind, tenant_id, NULL::jsonb AS payload, attempts,
       left(last_error, 500) AS last_error, error_type, reason,
       status, correlation_id, headers, created_at, updated_at, replay_count, replayed_at,
       discard_reason, discarded_at
FROM core.dead_letters
WHERE status = 'pending_review'
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(error_type)s::text IS NULL OR error_type = %(error_type)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
ORDER BY id
LIMIT %(limit)s;

-- name: lock_batch
-- The operation's next batch: pending rows after its last_id, up to its max_id, locked
-- for this transaction in the columns of the batch step (platform_tasks.dead_letters.batch;
-- %(payloads)s false leaves the payload and headers out, a discard does not read them).
-- SKIP LOCKED: a row a concurrent operation holds is that operation's; a row it committed
-- is no longer pending.
SELECT id, queue, kind, error_type,
       CASE WHEN %(payloads)s THEN payload END AS payload,
       CASE WHEN %(payloads)s THEN headers END AS headers
FROM core.dead_letters
WHERE status = 'pending_review'
  AND id > %(after_id)s
  AND id <= %(max_id)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(error_type)s::text IS NULL OR error_type = %(error_type)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: advance
-- The batch's progress, committed with the batch.
UPDATE core.operations
SET done = done + %(done)s, failed = failed + %(failed)s, last_id = %(last_id)s
WHERE id = %(id)s;

-- name: unfinished
-- Running operations of this kind and filter, oldest first: a rerun continues the first
-- whose process is gone (its advisory lock is free).
SELECT id FROM core.operations
WHERE kind = %(kind)s AND filter = %(filter)s AND outcome = 'running'
ORDER BY id;

-- name: stream_matching
-- Every matching pending row, oldest first, for a dry run (read through a server-side
-- cursor: one batch in memory).
SELECT id, queue, payload
FROM core.dead_letters
WHERE status = 'pending_review'
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(error_type)s::text IS NULL OR error_type = %(error_type)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
ORDER BY id;

-- name: skipped_in_range
-- Matching pending rows of a batch's id range that the batch did not lock: another
-- transaction held them (SKIP LOCKED). Revisited once the walk is done.
SELECT id
FROM core.dead_letters
WHERE status = 'pending_review'
  AND id > %(after_id)s
  AND id <= %(upto_id)s
  AND id <> ALL(%(locked)s::bigint[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(error_type)s::text IS NULL OR error_type = %(error_type)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
ORDER BY id;
