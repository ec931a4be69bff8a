-- Tables of the example app's maintenance consumers (schema example), applied by every
-- worker of celery_app.py at start-up. Idempotent; a fresh install gets two demo tenants.
CREATE SCHEMA IF NOT EXISTS example;

-- Events, partitioned per tenant, then per day (partitions created ahead by
-- example.create_partitions; rows outside them land in the tenant's default partition).
CREATE TABLE IF NOT EXISTS example.events (
    tenant_id   text        NOT NULL,
    occurred_at timestamptz NOT NULL,
    name        text        NOT NULL,
    payload     jsonb       NOT NULL DEFAULT '{}'
) PARTITION BY LIST (tenant_id);

CREATE TABLE IF NOT EXISTS example.retention_exports (
    tenant_id     text        NOT NULL,
    scheduled_for timestamptz NOT NULL,
    rows_exported integer     NOT NULL,
    file          text        NOT NULL,
    PRIMARY KEY (tenant_id, scheduled_for)
);

CREATE TABLE IF NOT EXISTS example.ledger_entries (
    tenant_id    text   NOT NULL,
    amount_cents bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS example.balances (
    tenant_id     text   PRIMARY KEY,
    balance_cents bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS example.reconciliations (
    tenant_id     text        NOT NULL,
    scheduled_for timestamptz NOT NULL,
    ledger_cents  bigint      NOT NULL,
    balance_cents bigint      NULL,
    matches       boolean     NOT NULL,
    PRIMARY KEY (tenant_id, scheduled_for)
);

CREATE TABLE IF NOT EXISTS example.freshness (
    tenant_id      text        PRIMARY KEY,
    freshness_tier text        NOT NULL,
    scheduled_for  timestamptz NOT NULL,
    recomputed_at  timestamptz NOT NULL DEFAULT now(),
    recomputations integer     NOT NULL DEFAULT 1
);

CREATE TABLE IF NOT EXISTS example.loyalty_points (
    tenant_id  text        NOT NULL,
    member_id  text        NOT NULL,
    points     integer     NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS example.expiring_points (
    tenant_id     text        NOT NULL,
    member_id     text        NOT NULL,
    points        integer     NOT NULL,
    expires_at    timestamptz NOT NULL,
    scheduled_for timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, member_id, expires_at)
);

CREATE TABLE IF NOT EXISTS example.usage_snapshots (
    tenant_id     text        NOT NULL,
    scheduled_for timestamptz NOT NULL,
    events_total  bigint      NOT NULL,
    PRIMARY KEY (tenant_id, scheduled_for)
);

-- A fresh install (no tenant at all) gets two demo tenants with a little data.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM core.tenants) THEN
        INSERT INTO core.tenants (tenant_id, freshness_tier)
        VALUES ('demo-tenant', '1h'), ('acme', 'nightly');
        INSERT INTO example.ledger_entries (tenant_id, amount_cents)
        VALUES ('demo-tenant', 1200), ('demo-tenant', -300), ('demo-tenant', 450);
        INSERT INTO example.balances (tenant_id, balance_cents) VALUES ('demo-tenant', 1350)
        ON CONFLICT (tenant_id) DO NOTHING;
        INSERT INTO example.loyalty_points (tenant_id, member_id, points, expires_at)
        VALUES ('demo-tenant', 'member-1', 500, now() + interval '3 days');
    END IF;
END $$;
