-- Queries of batches (migration 0010), loaded by name by platform_tasks.batches.store.
-- A child's shard is ((hashtext(job_id::text) % shards) + shards) % shards: hashtext may
-- be negative, the shard never is. Every statement runs in its caller's transaction.

-- name: create_batch
-- The batch's row, in the transaction that publishes its children.
INSERT INTO core.batches (batch_id, profile, description, shards, on_complete, on_success, on_death)
VALUES (%(batch)s, %(profile)s, %(description)s, %(shards)s, %(on_complete)s, %(on_success)s,
        %(on_death)s)

-- name: batch_of_job
-- The batch and shard count a job belongs to, for a running child that adds children.
SELECT b.batch_id, b.shards FROM core.batches b WHERE b.batch_id = %(batch)s

-- name: add_jobs
-- Children join the batch: one core.batch_jobs row each (a child added twice counts once)
-- and their shards' remaining counts go up by how many joined. Shards are updated in
-- shard order, so two transactions adding children at once never deadlock.
WITH added AS (
    INSERT INTO core.batch_jobs (batch_id, job_id, queue, kind, tenant_id)
    SELECT %(batch)s, u.job_id, u.queue, u.kind, u.tenant_id
    FROM unnest(%(jobs)s::uuid[], %(queues)s::text[], %(kinds)s::text[], %(tenants)s::text[])
         AS u (job_id, queue, kind, tenant_id)
    ON CONFLICT (batch_id, job_id) DO NOTHING
    RETURNING job_id
), per_shard AS (
    SELECT ((hashtext(added.job_id::text) %% b.shards) + b.shards) %% b.shards AS shard,
           count(*)::integer AS n
    FROM added, core.batches b
    WHERE b.batch_id = %(batch)s
    GROUP BY 1
)
INSERT INTO core.batch_shards (batch_id, shard, remaining)
SELECT %(batch)s, shard, n FROM per_shard ORDER BY shard
ON CONFLICT (batch_id, shard)
DO UPDATE SET remaining = core.batch_shards.remaining + EXCLUDED.remaining

-- name: batches_of_job
-- The batches a job is a child of, for an ending whose message did not name its batch (a
-- cancel, a dead letter without the header). Index batch_jobs_job_id.
SELECT batch_id FROM core.batch_jobs WHERE job_id = %(job)s

-- name: end_job
-- Count one ending of a child of a batch: its row gets the outcome only if it has none (a
-- duplicate or a redelivery finds it set and counts nothing) and its shard's remaining
-- drops by one. Returns (batch_id, remaining of the shard), or no row.
-- The child's row is found by its primary key (batch, job), whatever the parameters: the
-- statement is prepared once per session and runs its generic plan, which PostgreSQL
-- keeps only when it is no dearer than one planned for the parameters (an "IS NULL OR"
-- lookup the generic plan cannot make by key had it planned again for every child).
-- The row is locked first, whatever its outcome: a replay re-opening it (outcome back to
-- NULL, not yet committed) is waited for and its NULL seen; an UPDATE filtering on
-- "outcome IS NULL" alone would skip the row it still sees dead-lettered.
-- %(before_commit)s: the statement is sent with the COMMIT (after a savepoint); a shard it
-- brings to zero raises PTB01 (migration 0012) so that nothing commits before the
-- batch's completion was checked.
WITH locked AS (
    SELECT batch_id, job_id, outcome FROM core.batch_jobs
    WHERE batch_id = %(batch)s AND job_id = %(job)s
    FOR UPDATE
), ended AS (
    UPDATE core.batch_jobs bj
    SET outcome = %(outcome)s, ended_at = clock_timestamp()
    FROM locked
    WHERE bj.batch_id = locked.batch_id AND bj.job_id = locked.job_id
      AND locked.outcome IS NULL
    RETURNING bj.batch_id, bj.job_id
), counted AS (
    UPDATE core.batch_shards s
    SET remaining = s.remaining - 1
    FROM ended, core.batches b
    WHERE b.batch_id = ended.batch_id
      AND s.batch_id = ended.batch_id
      AND s.shard = ((hashtext(ended.job_id::text) %% b.shards) + b.shards) %% b.shards
    RETURNING s.batch_id, s.remaining
), bumped AS (
    -- the batch progressed: progressed_at moves at most once a second (a row every child
    -- wrote would be the hot row the shards avoid); a transaction that finds it fresh
    -- writes nothing. A shard brought to zero moves it in lock_batch instead.
    UPDATE core.batches SET progressed_at = clock_timestamp()
    WHERE batch_id IN (SELECT batch_id FROM counted WHERE remaining > 0)
      AND progressed_at < clock_timestamp() - interval '1 second'
)
SELECT batch_id, remaining,
       CASE WHEN remaining = 0 AND %(before_commit)s THEN core.batch_shard_emptied(batch_id) END
FROM counted

-- name: lock_batch
-- A shard reached zero: lock the batch's row, then its advisory lock, in that order in
-- every transaction (no deadlock), so the shard-zero transactions sum one after another
-- and the last of them sees every other shard committed.
UPDATE core.batches SET progressed_at = clock_timestamp() WHERE batch_id = %(batch)s;
SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(batch)s::text))

-- name: remaining
-- Children of the batch not ended yet (read after lock_batch: a fresh snapshot).
SELECT COALESCE(sum(remaining), 0)::bigint FROM core.batch_shards WHERE batch_id = %(batch)s

-- name: counts
-- The children by outcome (NULL: not ended yet).
SELECT outcome, count(*)::bigint FROM core.batch_jobs WHERE batch_id = %(batch)s GROUP BY outcome

-- name: mark_complete
-- Every child ended: record it (first time only) and, when every child was applied, the
-- success (first time only). Returns the callbacks to publish now: each is returned
-- only by the transaction that set its time, so each fires once.
WITH before AS (
    SELECT batch_id, complete_fired_at, success_fired_at
    FROM core.batches WHERE batch_id = %(batch)s FOR UPDATE
)
UPDATE core.batches b
SET complete_fired_at = COALESCE(b.complete_fired_at, now()),
    success_fired_at = CASE WHEN %(clean)s THEN COALESCE(b.success_fired_at, now())
                            ELSE b.success_fired_at END
FROM before
WHERE b.batch_id = before.batch_id
RETURNING CASE WHEN before.complete_fired_at IS NULL THEN b.on_complete END,
          CASE WHEN before.success_fired_at IS NULL AND %(clean)s THEN b.on_success END,
          b.created_at

-- name: mark_death
-- A child was dead-lettered: the first one fires on_death (once). Returns the callback
-- when this transaction set death_fired_at, no row otherwise.
UPDATE core.batches
SET death_fired_at = now()
WHERE batch_id = %(batch)s AND death_fired_at IS NULL
RETURNING on_death, created_at
