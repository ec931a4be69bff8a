-- Queries of the batches' read model (platform_tasks.batches.status) and stall watchdog
-- (platform_tasks.batches.watchdog). They only read core.batches / core.batch_jobs,
-- except claim_stall, which records the one alert of a stall.

-- name: list_batches
-- The newest batches (created before %(before)s when given; only those with a shard still
-- counting children when %(open_only)s), each with its children counted by outcome (NULL:
-- outstanding). The page is chosen on core.batches alone (index batches_created_at, the
-- shards' few rows per batch); only its batches have their core.batch_jobs rows counted
-- (the primary key's prefix).
WITH page AS (
    SELECT b.* FROM core.batches b
    WHERE (%(before)s::timestamptz IS NULL OR b.created_at < %(before)s)
      AND (NOT %(open_only)s OR EXISTS (SELECT 1 FROM core.batch_shards s
                                       WHERE s.batch_id = b.batch_id AND s.remaining > 0))
    ORDER BY b.created_at DESC, b.batch_id
    LIMIT %(limit)s
)
SELECT b.batch_id, b.profile, b.description, b.created_at, b.progressed_at,
       b.complete_fired_at, b.success_fired_at, b.death_fired_at, b.stall_alerted_at,
       b.on_complete, b.on_success, b.on_death,
       c.applied, c.dead_lettered, c.discarded, c.cancelled, c.outstanding
FROM page b
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE outcome = 'applied') AS applied,
           count(*) FILTER (WHERE outcome = 'dead_lettered') AS dead_lettered,
           count(*) FILTER (WHERE outcome = 'discarded') AS discarded,
           count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE outcome IS NULL) AS outstanding
    FROM core.batch_jobs j WHERE j.batch_id = b.batch_id
) c
ORDER BY b.created_at DESC, b.batch_id

-- name: one_batch
-- One batch with its children counted by outcome (as list_batches).
SELECT b.batch_id, b.profile, b.description, b.created_at, b.progressed_at,
       b.complete_fired_at, b.success_fired_at, b.death_fired_at, b.stall_alerted_at,
       b.on_complete, b.on_success, b.on_death,
       c.applied, c.dead_lettered, c.discarded, c.cancelled, c.outstanding
FROM core.batches b
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE outcome = 'applied') AS applied,
           count(*) FILTER (WHERE outcome = 'dead_lettered') AS dead_lettered,
           count(*) FILTER (WHERE outcome = 'discarded') AS discarded,
           count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE outcome IS NULL) AS outstanding
    FROM core.batch_jobs j WHERE j.batch_id = b.batch_id
) c
WHERE b.batch_id = %(batch)s

-- name: tenant_counts
-- One batch's children by tenant and outcome, the tenants with the most children first.
SELECT tenant_id,
       count(*) FILTER (WHERE outcome = 'applied') AS applied,
       count(*) FILTER (WHERE outcome = 'dead_lettered') AS dead_lettered,
       count(*) FILTER (WHERE outcome = 'discarded') AS discarded,
       count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE outcome IS NULL) AS outstanding
FROM core.batch_jobs
WHERE batch_id = %(batch)s
GROUP BY tenant_id
ORDER BY count(*) DESC, tenant_id
LIMIT %(limit)s

-- name: tenant_total
-- How many tenants one batch's children belong to (the table above may be cut).
SELECT count(DISTINCT tenant_id) FROM core.batch_jobs WHERE batch_id = %(batch)s

-- name: outstanding_jobs
-- The children of one batch that have not ended, oldest first (where they are is looked
-- up in the delay store and the workers, not here).
SELECT job_id::text FROM core.batch_jobs
WHERE batch_id = %(batch)s AND outcome IS NULL
ORDER BY added_at, job_id
LIMIT %(limit)s

-- name: dead_pending
-- Children of one batch with a dead letter pending review (what a replay would re-open).
SELECT count(DISTINCT j.job_id)
FROM core.batch_jobs j
JOIN core.dead_letters d ON d.job_id = j.job_id AND d.status = 'pending_review'
WHERE j.batch_id = %(batch)s

-- name: stall_candidates
-- Batches with children outstanding whose last progress (progressed_at, or the newest
-- ending, whichever is later) is older than %(cutoff)s and whose stall has not been
-- alerted yet (no alert, or one from before the last progress: a new stall).
-- progressed_at (bumped by the endings, at most once a second), stall_alerted_at and
-- the shards' remaining counts filter first (a few rows per batch), so an alerted stall
-- or a finished batch costs no read of its children; the children are read only for
-- the batches left.
SELECT b.batch_id, b.description, b.created_at, p.last_progress, p.outstanding
FROM core.batches b
CROSS JOIN LATERAL (
    SELECT GREATEST(b.progressed_at, max(j.ended_at)) AS last_progress,
           count(*) FILTER (WHERE j.outcome IS NULL) AS outstanding
    FROM core.batch_jobs j WHERE j.batch_id = b.batch_id
) p
WHERE b.progressed_at < %(cutoff)s
  AND (b.stall_alerted_at IS NULL OR b.stall_alerted_at < b.progressed_at)
  AND EXISTS (SELECT 1 FROM core.batch_shards s
              WHERE s.batch_id = b.batch_id AND s.remaining > 0)
  AND p.outstanding > 0
  AND p.last_progress < %(cutoff)s
  AND (b.stall_alerted_at IS NULL OR b.stall_alerted_at < p.last_progress)
ORDER BY p.last_progress
LIMIT %(limit)s

-- name: claim_stall
-- Record the alert of this stall; only one watchdog's UPDATE matches (the row lock
-- serialises them and the second sees stall_alerted_at already past the last progress).
UPDATE core.batches SET stall_alerted_at = %(now)s
WHERE batch_id = %(batch)s
  AND (stall_alerted_at IS NULL OR stall_alerted_at < %(last_progress)s)
RETURNING batch_id

-- name: release_stall
-- The alert could not be sent: let the next pass try again.
UPDATE core.batches SET stall_alerted_at = NULL
WHERE batch_id = %(batch)s AND stall_alerted_at = %(now)s
