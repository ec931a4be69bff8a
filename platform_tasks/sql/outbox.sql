-- Queries of the transactional outbox, loaded by name by platform_tasks.publishing.outbox
-- (the write, in the publisher's transaction) and platform_tasks.publishing.outbox_relay.

-- name: insert_row
-- One finished message, in the caller's transaction.
INSERT INTO core.outbox (profile, broker, job_id, queue, target, message, entry_id, due_ms)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)

-- name: listen
-- The channel the insert trigger notifies at commit (migration 0008).
LISTEN platform_outbox

-- name: claim_batch
-- The oldest committed rows of this profile no other relay holds: locked until this
-- relay's transaction ends, so concurrent relays take disjoint batches, and a relay that
-- dies before its commit leaves its rows to the next one. The transaction begins in the
-- same round trip.
BEGIN;
SELECT id, broker, queue, target, message, entry_id, due_ms
FROM core.outbox
WHERE profile = %s
ORDER BY id
LIMIT %s
FOR UPDATE SKIP LOCKED

-- name: delete_rows
-- Rows the broker accepted, deleted and committed in one round trip.
DELETE FROM core.outbox WHERE id = ANY(%s);
COMMIT

-- name: measure
-- Rows waiting and the age in seconds of the oldest one (NULL: none), by the server clock.
SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
FROM core.outbox
WHERE profile = %s
