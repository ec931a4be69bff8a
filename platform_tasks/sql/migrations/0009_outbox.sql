-- The transactional outbox: jobs published with publish(..., tx=conn) or from inside a
-- PlatformTask handler wait here, inserted in the publisher's transaction, until a relay
-- (in every worker and beat) has handed them to the broker. A row exists if and only if
-- its transaction committed, so a job exists if and only if that transaction committed.
--
-- message holds the finished broker message (the bytes a direct publish sends):
--   broker 'redis', a publish: the kombu wire message, LPUSHed as is onto list target
--   broker 'redis', a schedule: the delay store's entry {"q": list key, "m": wire}
--   broker 'amqp':  an AMQP message {"q", "e", "r", "b", "p"} (publishing/amqp_wire.py)
--   broker 'unique': a unique publish's request {"payload", "opts", "unique", "trace"},
--                    made by the relay through the queue port (the key's lock is Redis's)
-- due_ms is NULL for a publish; for a schedule it is the due time (ms since the epoch),
-- and entry_id, when set, the delay store's entry id: the relay stores the row there.
CREATE TABLE IF NOT EXISTS core.outbox (
    id         bigserial   PRIMARY KEY,
    profile    text        NOT NULL,
    broker     text        NOT NULL CHECK (broker IN ('redis', 'amqp', 'unique')),
    job_id     uuid        NOT NULL,
    queue      text        NOT NULL,
    target     text,
    message    text        NOT NULL,
    entry_id   text,
    due_ms     bigint,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS outbox_profile_id ON core.outbox (profile, id);

-- Wake the relays when rows commit: NOTIFY is delivered at commit (never for a rollback)
-- and folded to one notification per transaction, so a bulk insert wakes them once.
CREATE OR REPLACE FUNCTION core.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('platform_outbox', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_notify ON core.outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON core.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION core.outbox_notify();
