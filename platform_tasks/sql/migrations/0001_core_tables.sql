-- Schema core: idempotency rows and dead letters.
CREATE SCHEMA IF NOT EXISTS core;

CREATE TABLE IF NOT EXISTS core.processed_jobs (
    job_id       uuid        NOT NULL,
    consumer     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, consumer)
);

-- TTL cleanup deletes the oldest rows in batches.
CREATE INDEX IF NOT EXISTS processed_jobs_processed_at_idx
    ON core.processed_jobs (processed_at);

CREATE TABLE IF NOT EXISTS core.dead_letters (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id         uuid        NULL,
    queue          text        NULL,
    kind           text        NULL,
    tenant_id      text        NULL,
    payload        jsonb       NOT NULL,
    attempts       integer     NOT NULL DEFAULT 0,
    last_error     text        NULL,
    error_type     text        NULL,
    reason         text        NOT NULL DEFAULT 'failed',
    status         text        NOT NULL DEFAULT 'pending_review'
                   CHECK (status IN ('pending_review', 'replayed', 'discarded')),
    correlation_id text        NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    replay_count   integer     NOT NULL DEFAULT 0,
    replayed_at    timestamptz NULL,
    discard_reason text        NULL,
    discarded_at   timestamptz NULL
);

CREATE INDEX IF NOT EXISTS dead_letters_status_created_idx
    ON core.dead_letters (status, created_at);
CREATE INDEX IF NOT EXISTS dead_letters_queue_idx
    ON core.dead_letters (queue, created_at);
CREATE INDEX IF NOT EXISTS dead_letters_kind_idx
    ON core.dead_letters (kind, created_at);
CREATE INDEX IF NOT EXISTS dead_letters_tenant_idx
    ON core.dead_letters (tenant_id, created_at);
CREATE INDEX IF NOT EXISTS dead_letters_created_idx
    ON core.dead_letters (created_at);
CREATE INDEX IF NOT EXISTS dead_letters_job_id_idx
    ON core.dead_letters (job_id);
