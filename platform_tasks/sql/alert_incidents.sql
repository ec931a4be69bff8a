-- Queries of the dead-letter incidents (core.alert_outbox, core.alert_incidents), loaded
-- by name by platform_tasks.dead_letters.incidents. A group is sink + queue + kind +
-- error type ('' for an unknown queue or kind; the reason when there is no error type).

-- name: take_outbox
-- Dead letters to count, taken off the outbox (SKIP LOCKED: a batch another sender holds
-- is its own), with what their rows say. The dead letters are read, never locked.
WITH taken AS (
    DELETE FROM core.alert_outbox
    WHERE dead_letter_id IN (
        SELECT dead_letter_id FROM core.alert_outbox
        ORDER BY dead_letter_id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING dead_letter_id
)
SELECT d.id, coalesce(d.queue, ''), coalesce(d.kind, ''), coalesce(d.error_type, d.reason),
       d.status, d.created_at
FROM taken JOIN core.dead_letters AS d ON d.id = taken.dead_letter_id
ORDER BY d.id;

-- name: count_into_group
-- Add pending dead letters to their group. A new group, or one whose incident was
-- resolved, opens (an incident is to be sent); an open group only counts. A group
-- resolved whose resolve was not sent yet goes on with the same incident (nothing sent).
INSERT INTO core.alert_incidents AS g
    (sink, queue, kind, error_type, state, opened_at, last_seen_at, dead_letters, to_send)
VALUES
    (%(sink)s, %(queue)s, %(kind)s, %(error_type)s, 'open', %(first_seen)s, %(last_seen)s,
     %(count)s, 'open')
ON CONFLICT (sink, queue, kind, error_type) DO UPDATE SET
    state = 'open',
    opened_at = CASE
        WHEN g.state = 'resolved' AND g.to_send IS DISTINCT FROM 'resolve'
        THEN excluded.opened_at ELSE least(g.opened_at, excluded.opened_at) END,
    last_seen_at = greatest(g.last_seen_at, excluded.last_seen_at),
    dead_letters = CASE
        WHEN g.state = 'resolved' AND g.to_send IS DISTINCT FROM 'resolve'
        THEN excluded.dead_letters ELSE g.dead_letters + excluded.dead_letters END,
    incident_id = CASE
        WHEN g.state = 'resolved' AND g.to_send IS DISTINCT FROM 'resolve'
        THEN NULL ELSE g.incident_id END,
    to_send = CASE
        WHEN g.state = 'open' THEN g.to_send
        WHEN g.to_send = 'resolve' THEN NULL
        ELSE 'open' END,
    attempts = CASE WHEN g.state = 'resolved' THEN 0 ELSE g.attempts END,
    next_attempt_at = CASE WHEN g.state = 'resolved' THEN now() ELSE g.next_attempt_at END,
    resolve_note = CASE WHEN g.state = 'resolved' THEN NULL ELSE g.resolve_note END,
    resolved_at = CASE WHEN g.state = 'resolved' THEN NULL ELSE g.resolved_at END;

-- name: open_groups
SELECT id, queue, kind, error_type, opened_at, dead_letters
FROM core.alert_incidents
WHERE sink = %(sink)s AND state = 'open'
ORDER BY id;

-- name: group_has_pending
SELECT EXISTS (
    SELECT 1 FROM core.dead_letters
    WHERE status = 'pending_review'
      AND coalesce(queue, '') = %(queue)s
      AND coalesce(kind, '') = %(kind)s
      AND coalesce(error_type, reason) = %(error_type)s
);

-- name: group_outcome
-- What became of the group's rows since it opened: how many were replayed or discarded,
-- the last discard reason, and when the last of them changed.
SELECT count(*) FILTER (WHERE status = 'replayed'),
       count(*) FILTER (WHERE status = 'discarded'),
       (array_agg(discard_reason ORDER BY updated_at DESC)
            FILTER (WHERE status = 'discarded'))[1],
       max(updated_at)
FROM core.dead_letters
WHERE status <> 'pending_review'
  AND coalesce(queue, '') = %(queue)s
  AND coalesce(kind, '') = %(kind)s
  AND coalesce(error_type, reason) = %(error_type)s
  AND updated_at >= %(opened_at)s;

-- name: operation_at
-- The bulk replay or discard that was running when a row of the group last changed.
SELECT id, kind, actor
FROM core.operations
WHERE kind IN ('replay', 'discard')
  AND started_at <= %(at)s
  AND (finished_at IS NULL OR finished_at >= %(at)s)
ORDER BY started_at DESC
LIMIT 1;

-- name: resolve_group
-- Resolve an open group that has no pending row, unless rows were counted into it since
-- it was read (dead_letters moved): those are looked at on the next pass. Its incident
-- is to be resolved when it has one; a group whose incident was never opened sends
-- nothing (a create still in flight resolves what it opens when it records its id).
UPDATE core.alert_incidents AS g
SET state = 'resolved',
    resolved_at = now(),
    resolve_note = %(note)s,
    to_send = CASE WHEN g.incident_id IS NOT NULL THEN 'resolve' ELSE NULL END,
    attempts = 0,
    next_attempt_at = now()
WHERE g.id = %(id)s
  AND g.state = 'open'
  AND g.dead_letters = %(dead_letters)s
  AND NOT EXISTS (
      SELECT 1 FROM core.dead_letters
      WHERE status = 'pending_review'
        AND coalesce(queue, '') = g.queue
        AND coalesce(kind, '') = g.kind
        AND coalesce(error_type, reason) = g.error_type
  )
RETURNING g.id, g.incident_id;

-- name: claim_due
-- Groups with something to send whose time has come, leased to this sender for the
-- length of a call, so two senders never call for one group at once.
UPDATE core.alert_incidents
SET lease_until = now() + make_interval(secs => %(lease_seconds)s),
    attempts = attempts + 1
WHERE id IN (
    SELECT id FROM core.alert_incidents
    WHERE sink = %(sink)s
      AND to_send IS NOT NULL
      AND next_attempt_at <= now()
      AND (lease_until IS NULL OR lease_until < now())
    ORDER BY next_attempt_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, to_send, incident_id, queue, kind, error_type, opened_at, last_seen_at,
          dead_letters, resolve_note, attempts;

-- name: group_summary
-- What an incident says about its group: the rows pending review now.
SELECT count(*),
       count(DISTINCT tenant_id),
       (array_agg(DISTINCT tenant_id) FILTER (WHERE tenant_id IS NOT NULL))[1:5],
       min(created_at),
       max(created_at),
       (array_agg(id ORDER BY id DESC))[1],
       (array_agg(job_id ORDER BY id DESC))[1],
       (array_agg(reason ORDER BY id DESC))[1]
FROM core.dead_letters
WHERE status = 'pending_review'
  AND coalesce(queue, '') = %(queue)s
  AND coalesce(kind, '') = %(kind)s
  AND coalesce(error_type, reason) = %(error_type)s;

-- name: record_opened
-- The sink opened the incident. If the group was resolved meanwhile, its resolve is
-- what is left to send.
UPDATE core.alert_incidents
SET incident_id = %(incident_id)s,
    to_send = CASE WHEN state = 'resolved' THEN 'resolve' ELSE NULL END,
    attempts = 0,
    next_attempt_at = now(),
    lease_until = NULL,
    last_error = NULL,
    sent_at = now()
WHERE id = %(id)s;

-- name: record_resolved
-- The sink resolved the incident. If the group opened again meanwhile, it needs a new one.
UPDATE core.alert_incidents
SET to_send = CASE WHEN state = 'open' THEN 'open' ELSE NULL END,
    incident_id = CASE WHEN state = 'open' THEN NULL ELSE incident_id END,
    attempts = 0,
    next_attempt_at = now(),
    lease_until = NULL,
    last_error = NULL,
    sent_at = now()
WHERE id = %(id)s;

-- name: record_failed
-- The call failed: try again after the retry interval, from what this row says.
UPDATE core.alert_incidents
SET next_attempt_at = now() + make_interval(secs => %(retry_seconds)s),
    lease_until = NULL,
    last_error = %(error)s
WHERE id = %(id)s;
