-- Dead-letter incidents (Better Stack): one incident per group of dead letters (queue +
-- kind + error type), opened when the group gets a pending row and resolved when it has
-- none left. The alert sender works only from these tables, after the dead letter
-- committed, so an alert that fails is retried from here and never touches a delivery.

-- Dead letters not yet counted into their group: written in the dead letter's own INSERT
-- statement (so a committed dead letter always has its entry), taken off by the alert
-- sender. A queue of its own rather than a column of core.dead_letters: the sender never
-- locks a dead letter, so a replay (FOR UPDATE SKIP LOCKED) never skips one it holds.
CREATE TABLE IF NOT EXISTS core.alert_outbox (
    dead_letter_id bigint PRIMARY KEY
);

-- Whether a group still has rows pending review (is its incident resolved?), per group.
CREATE INDEX IF NOT EXISTS dead_letters_pending_group_idx
    ON core.dead_letters (coalesce(queue, ''), coalesce(kind, ''), coalesce(error_type, reason))
    WHERE status = 'pending_review';

-- One row per sink and group: its incident (NULL until the sink gave an id), whether the
-- group is open, and what is still to be sent (to_send), when (next_attempt_at) and why
-- the last call failed. lease_until keeps two senders from calling for one row at once.
CREATE TABLE IF NOT EXISTS core.alert_incidents (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink            text        NOT NULL,
    queue           text        NOT NULL,
    kind            text        NOT NULL,
    error_type      text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('open', 'resolved')),
    incident_id     text        NULL,
    opened_at       timestamptz NOT NULL,
    last_seen_at    timestamptz NOT NULL,
    dead_letters    bigint      NOT NULL DEFAULT 0,
    to_send         text        NULL CHECK (to_send IN ('open', 'resolve')),
    resolve_note    text        NULL,
    resolved_at     timestamptz NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_until     timestamptz NULL,
    last_error      text        NULL,
    sent_at         timestamptz NULL,
    UNIQUE (sink, queue, kind, error_type)
);

CREATE INDEX IF NOT EXISTS alert_incidents_to_send_idx
    ON core.alert_incidents (sink, next_attempt_at) WHERE to_send IS NOT NULL;
