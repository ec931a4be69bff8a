-- Jobs whose delivery state lives in Redis: a failed attempt, a counted redelivery, a
-- replay restart, a dead letter. The consumer writes the mark (committed on its own)
-- before it writes the job's Redis hash, and the claim of a first delivery reads it in
-- the claim's own round trip: a job without a mark (almost every job) skips the Redis read.
CREATE TABLE IF NOT EXISTS core.delivery_marks (
    job_id    uuid        NOT NULL,
    consumer  text        NOT NULL,
    marked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, consumer)
);
