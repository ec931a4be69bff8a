-- Job status: what a job's own transaction records about it, read by `platform-tasks jobs
-- show`, `jobs list --correlation-id` and the console's job search.
--
-- output: the small JSON value a handler returned (capped by PLATFORM_JOB_OUTPUT_MAX_BYTES),
-- written in the job's transaction with its claim, so it exists if and only if the job's
-- work committed; NULL when the handler returned None. It lives as long as the row
-- (PLATFORM_PROCESSED_JOBS_TTL_DAYS).
-- correlation_id: the envelope's, written by the claim itself (no extra statement), so the
-- jobs of one request are found by index. NULL for rows claimed before this migration or
-- with PLATFORM_JOB_STATUS=false; the partial index leaves those rows out, so a deployment
-- that switches it off pays nothing for it.
ALTER TABLE core.processed_jobs ADD COLUMN IF NOT EXISTS output jsonb NULL;
ALTER TABLE core.processed_jobs ADD COLUMN IF NOT EXISTS correlation_id text NULL;
CREATE INDEX IF NOT EXISTS processed_jobs_correlation_idx
    ON core.processed_jobs (correlation_id) WHERE correlation_id IS NOT NULL;

-- Dead letters of one request (the job search by correlation id).
CREATE INDEX IF NOT EXISTS dead_letters_correlation_idx
    ON core.dead_letters (correlation_id) WHERE correlation_id IS NOT NULL;

-- The claim of 0004, recording the job's correlation id in the same insert. The
-- two-argument form stays for workers of the previous release during a rolling deploy.
CREATE OR REPLACE FUNCTION core.claim_delivery(
    p_job_id uuid, p_consumer text, p_correlation_id text,
    OUT claimed boolean, OUT marked boolean
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO core.processed_jobs (job_id, consumer, correlation_id)
    VALUES (p_job_id, p_consumer, p_correlation_id)
    ON CONFLICT (job_id, consumer) DO NOTHING;
    claimed := FOUND;
    marked := current_setting('transaction_isolation') <> 'read committed'
        OR EXISTS (SELECT 1 FROM core.delivery_marks
                   WHERE job_id = p_job_id AND consumer = p_consumer)
        OR EXISTS (SELECT 1 FROM core.dead_letters WHERE job_id = p_job_id);
END
$$;
