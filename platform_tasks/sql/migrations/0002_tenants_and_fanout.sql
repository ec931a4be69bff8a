-- Tenants (the default source of per-tenant fan-out) and fan-out progress markers.
CREATE TABLE IF NOT EXISTS core.tenants (
    tenant_id      text        PRIMARY KEY,
    freshness_tier text        NOT NULL DEFAULT 'nightly'
                   CHECK (freshness_tier IN ('nightly', '12h', '6h', '3h', '1h')),
    active         boolean     NOT NULL DEFAULT true,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- How far each fan-out job has published: a redelivered or replayed fan-out resumes
-- after last_tenant_id. Written outside the fan-out's own transaction.
CREATE TABLE IF NOT EXISTS core.fanout_progress (
    job_id         uuid        PRIMARY KEY,
    job_name       text        NOT NULL,
    point          timestamptz NOT NULL,
    kind           text        NOT NULL,
    last_tenant_id text        NULL,
    published      bigint      NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz NULL
);

CREATE INDEX IF NOT EXISTS fanout_progress_finished_idx
    ON core.fanout_progress (finished_at);
