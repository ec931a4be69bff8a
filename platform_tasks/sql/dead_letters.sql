-- Queries of core.dead_letters, loaded by name by platform_tasks.dead_letters.

-- name: insert_dead_letter
-- One row per job that will not be retried; the caller's transaction commits it. The
-- same statement queues the row for the alert sender (core.alert_outbox), so a dead
-- letter that committed is always one the sender will count into its incident.
WITH written AS (
    INSERT INTO core.dead_letters
        (job_id, queue, kind, tenant_id, payload, attempts, last_error, error_type, reason,
         correlation_id, headers)
    VALUES
        (%(job_id)s, %(queue)s, %(kind)s, %(tenant_id)s, %(payload)s, %(attempts)s,
         %(last_error)s, %(error_type)s, %(reason)s, %(correlation_id)s, %(headers)s)
    RETURNING id
), queued AS (
    INSERT INTO core.alert_outbox (dead_letter_id) SELECT id FROM written
)
SELECT id FROM written;

-- name: list_dead_letters
-- Newest first; every filter is optional (NULL means "any").
SELECT id, job_id, queue, kind, tenant_id, payload, attempts, last_error, error_type, reason,
       status, correlation_id, headers, created_at, updated_at, replay_count, replayed_at,
       discard_reason, discarded_at
FROM core.dead_letters
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: list_dead_letter_summaries
-- What the list table shows: every column but the payload (never loaded here), and only
-- the start of last_error; newest first, every filter optional.
SELECT id, job_id, queue, kind, tenant_id, NULL::jsonb AS payload, attempts,
       left(last_error, 500) AS last_error, error_type, reason,
       status, correlation_id, headers, created_at, updated_at, replay_count, replayed_at,
       discard_reason, discarded_at
FROM core.dead_letters
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: get_dead_letter
SELECT id, job_id, queue, kind, tenant_id, payload, attempts, last_error, error_type, reason,
       status, correlation_id, headers, created_at, updated_at, replay_count, replayed_at,
       discard_reason, discarded_at
FROM core.dead_letters
WHERE id = %(id)s;

-- name: statuses_of
-- Which of the given ids exist, and in which status (to explain what was not acted on).
SELECT id, status FROM core.dead_letters WHERE id = ANY(%(ids)s) ORDER BY id;

-- name: select_replay_candidates
-- Pending rows a replay would act on, without locking them (dry run).
SELECT id, job_id, queue, kind, tenant_id, payload, headers
FROM core.dead_letters
WHERE status = 'pending_review'
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
ORDER BY id;

-- name: lock_replay_batch
-- The next batch of pending rows after %(after_id)s, locked for this transaction, in the
-- columns of the batch step (platform_tasks.dead_letters.batch).
-- SKIP LOCKED: a row another replay holds is that replay's to publish; a row it has
-- already committed as replayed no longer matches status = 'pending_review'.
SELECT id, queue, kind, error_type, payload, headers
FROM core.dead_letters
WHERE status = 'pending_review'
  AND id > %(after_id)s
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: lock_pending
-- The named rows that are pending, locked for this transaction in the columns of the batch
-- step, waiting for a transaction that holds one: a row it commits as replayed or
-- discarded drops out, a row it rolls back is this one's. %(payloads)s false leaves the
-- payload and headers out (a discard does not read them).
SELECT id, queue, kind, error_type,
       CASE WHEN %(payloads)s THEN payload END AS payload,
       CASE WHEN %(payloads)s THEN headers END AS headers
FROM core.dead_letters
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'pending_review'
ORDER BY id
FOR UPDATE;

-- name: mark_replayed
-- Rows this transaction holds locked and has published.
UPDATE core.dead_letters
SET status = 'replayed',
    replay_count = replay_count + 1,
    replayed_at = %(now)s,
    updated_at = %(now)s
WHERE id = ANY(%(ids)s) AND status = 'pending_review';

-- name: mark_discarded
-- Rows this transaction holds locked, with the operator's reason.
UPDATE core.dead_letters
SET status = 'discarded',
    discard_reason = %(reason)s,
    discarded_at = %(now)s,
    updated_at = %(now)s
WHERE id = ANY(%(ids)s) AND status = 'pending_review';

-- name: stale_dead_letters
-- Pending rows older than the alert age, grouped so the alert can say where they are.
SELECT queue, kind, count(*) AS rows, min(created_at) AS oldest
FROM core.dead_letters
WHERE status = 'pending_review' AND created_at < %(cutoff)s
GROUP BY queue, kind
ORDER BY count(*) DESC, queue, kind;

-- name: reopen_batch_child
-- A dead letter of a batch's child is replayed (migration 0010): the child has not ended
-- any more, its shard counts it again, in the replay's transaction and before its
-- publish. Returns the batch when it was re-opened (the child was dead-lettered).
WITH reopened AS (
    UPDATE core.batch_jobs
    SET outcome = NULL, ended_at = NULL
    WHERE job_id = %(job)s AND outcome = 'dead_lettered'
      AND (%(batch)s::uuid IS NULL OR batch_id = %(batch)s::uuid)
    RETURNING batch_id, job_id
)
UPDATE core.batch_shards s
SET remaining = s.remaining + 1
FROM reopened, core.batches b
WHERE b.batch_id = reopened.batch_id
  AND s.batch_id = reopened.batch_id
  AND s.shard = ((hashtext(reopened.job_id::text) %% b.shards) + b.shards) %% b.shards
RETURNING s.batch_id

-- name: discard_batch_children
-- Dead letters an operator discarded (final): their children's outcome, dead_lettered
-- until now, becomes discarded. They had ended already: no shard changes.
UPDATE core.batch_jobs bj
SET outcome = 'discarded'
FROM core.dead_letters d
WHERE d.id = ANY(%(ids)s::bigint[])
  AND d.job_id IS NOT NULL
  AND bj.job_id = d.job_id
  AND bj.outcome = 'dead_lettered'
