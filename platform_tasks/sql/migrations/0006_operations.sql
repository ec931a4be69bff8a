-- The operations log: one row per bulk action an operator ran (replay, discard, cancel,
-- pause, resume), with who ran it, on what filter, and how far it got. A bulk replay or
-- discard records its progress here (last_id), so rerunning the same filter after a crash
-- continues the unfinished operation instead of starting a second one.
CREATE TABLE IF NOT EXISTS core.operations (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    actor       text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz NULL,
    kind        text        NOT NULL
                CHECK (kind IN ('replay', 'discard', 'cancel', 'pause', 'resume')),
    filter      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    matched     bigint      NOT NULL DEFAULT 0,
    done        bigint      NOT NULL DEFAULT 0,
    failed      bigint      NOT NULL DEFAULT 0,
    outcome     text        NOT NULL DEFAULT 'running'
                CHECK (outcome IN ('running', 'succeeded', 'partial', 'failed')),
    last_id     bigint      NOT NULL DEFAULT 0,
    max_id      bigint      NULL,
    detail      text        NULL
);

CREATE INDEX IF NOT EXISTS operations_started_idx ON core.operations (started_at DESC);
-- A rerun finds the unfinished operation of the same kind and filter.
CREATE INDEX IF NOT EXISTS operations_running_idx
    ON core.operations (kind, filter) WHERE outcome = 'running';

-- Bulk actions filter by error type and an end time as well.
CREATE INDEX IF NOT EXISTS dead_letters_error_type_idx
    ON core.dead_letters (error_type, created_at);

-- One accounting row per cancelled job, whichever of the operation's paths (the delay
-- store sweep, the consumer's check) reached it first.
CREATE UNIQUE INDEX IF NOT EXISTS dead_letters_cancelled_job_idx
    ON core.dead_letters (job_id) WHERE reason = 'cancelled';

-- Cancels in force: consumers do not run a job that matches one (tenant, kind, queue;
-- NULL means any) and was published at or before its cutoff. Read by every consumer at
-- most every quarter second, so the table stays small: rules expire, and a lifted or
-- expired rule is deleted.
CREATE TABLE IF NOT EXISTS core.cancel_rules (
    operation_id bigint      PRIMARY KEY REFERENCES core.operations (id),
    tenant_id    text        NULL,
    kind         text        NULL,
    queue        text        NULL,
    cutoff       timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    CHECK (tenant_id IS NOT NULL OR kind IS NOT NULL OR queue IS NOT NULL)
);
