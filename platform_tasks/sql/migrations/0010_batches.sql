-- Batches: one callback after every job of a group has ended. A child counts once, in
-- its own transaction: its core.batch_jobs row gets an outcome (only if it has none) and
-- its shard's remaining count drops by one. Shards spread the counting over rows so that
-- thousands of children ending at once never wait on one row; the transaction that brings
-- a shard to zero takes the batch's advisory lock and sums the shards: the last of them
-- sees every other shard committed, so exactly one transaction sees zero and publishes
-- the callbacks (through core.outbox, in that same transaction).
CREATE TABLE IF NOT EXISTS core.batches (
    batch_id          uuid        PRIMARY KEY,
    profile           text        NOT NULL,
    description       text        NOT NULL DEFAULT '',
    shards            smallint    NOT NULL,
    on_complete       jsonb       NULL,
    on_success        jsonb       NULL,
    on_death          jsonb       NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    progressed_at     timestamptz NOT NULL DEFAULT now(),
    complete_fired_at timestamptz NULL,
    success_fired_at  timestamptz NULL,
    death_fired_at    timestamptz NULL,
    stall_alerted_at  timestamptz NULL
);
CREATE INDEX IF NOT EXISTS batches_created_at ON core.batches (created_at);

CREATE TABLE IF NOT EXISTS core.batch_shards (
    batch_id  uuid     NOT NULL REFERENCES core.batches (batch_id) ON DELETE CASCADE,
    shard     smallint NOT NULL,
    remaining integer  NOT NULL,
    PRIMARY KEY (batch_id, shard)
);

CREATE TABLE IF NOT EXISTS core.batch_jobs (
    batch_id  uuid        NOT NULL REFERENCES core.batches (batch_id) ON DELETE CASCADE,
    job_id    uuid        NOT NULL,
    queue     text        NOT NULL,
    kind      text        NOT NULL,
    tenant_id text        NOT NULL,
    added_at  timestamptz NOT NULL DEFAULT now(),
    outcome   text        NULL
              CHECK (outcome IN ('applied', 'dead_lettered', 'discarded', 'cancelled')),
    ended_at  timestamptz NULL,
    PRIMARY KEY (batch_id, job_id)
);
CREATE INDEX IF NOT EXISTS batch_jobs_job_id ON core.batch_jobs (job_id);
