-- One row per recipient a blast sent to: (tenant, campaign, recipient) is claimed by the
-- chunk job that sends to it, inside that job's own transaction (with its idempotency
-- row), so a campaign published again (reordered, recipients added or removed, chunked
-- differently) reaches each recipient at most once, and a recipient whose send rolled
-- back (throttled, failed, dead-lettered) is free for the next publish. The recipient is
-- kept as 16 bytes of SHA-256 of its normalised address, not the address itself.
CREATE TABLE IF NOT EXISTS core.blast_recipients (
    tenant_id     text        NOT NULL,
    campaign_id   text        NOT NULL,
    recipient_key bytea       NOT NULL,
    job_id        uuid        NOT NULL,
    claimed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, campaign_id, recipient_key)
);
