-- Queries of blasts (platform_tasks.notifications), loaded by name.

-- name: claim_recipients
-- Claim the recipients of one chunk job for its campaign, in the job's own transaction.
-- Returns the keys this job claimed: a key claimed by another job is not returned (a
-- claim that job still holds uncommitted is waited for, then not returned if it
-- committed). The keys come sorted, so two jobs claiming overlapping sets take their row
-- locks in one order and never deadlock.
INSERT INTO core.blast_recipients (tenant_id, campaign_id, recipient_key, job_id)
SELECT %(tenant_id)s, %(campaign_id)s, keys.key, %(job_id)s
  FROM unnest(%(keys)s::bytea[]) WITH ORDINALITY AS keys (key, n)
 ORDER BY keys.n
ON CONFLICT (tenant_id, campaign_id, recipient_key) DO NOTHING
RETURNING recipient_key

-- name: settled_jobs
-- Of the job ids given, those that are settled: applied (an idempotency row) or
-- dead-lettered. What a blast publisher waits on to bound its jobs in flight.
SELECT job_id FROM core.processed_jobs WHERE job_id = ANY(%(job_ids)s::uuid[])
UNION
SELECT job_id FROM core.dead_letters WHERE job_id = ANY(%(job_ids)s::uuid[])
