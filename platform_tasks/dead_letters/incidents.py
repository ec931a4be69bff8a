"""What the alert sender knows, kept in PostgreSQL: dead letters grouped into incidents.

A group is queue + kind + error type (the reason when there is no error type), as Sentry
groups the same dead letters. ``core.alert_incidents`` has one row per sink and group:
whether the group is open (it has dead letters pending review), the sink's incident id,
and what is still to be sent (``to_send``: ``open`` or ``resolve``), from when
(``next_attempt_at``) and why the last call failed. Every dead letter's own ``INSERT``
also queues its id in ``core.alert_outbox``, so a committed dead letter is always counted.

Each step is a short transaction, and none holds a lock while a sink is called: a call
is leased (``lease_until``) instead, so a sender that dies mid-call leaves the group to
the next one after the lease. A group is resolved in the same statement that checks it
has no pending row left, so a dead letter counted meanwhile is never resolved away.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg2.extensions import connection as Connection

from platform_tasks.postgres.queries import load_queries

__all__ = [
    "PENDING_REVIEW",
    "Claimed",
    "GroupSummary",
    "claim_due",
    "count_new_dead_letters",
    "drain_outbox",
    "group_summary",
    "record_failed",
    "record_opened",
    "record_resolved",
    "resolve_fixed_groups",
]

PENDING_REVIEW = "pending_review"
OUTBOX_BATCH = 1000
"""Dead letters taken off the outbox per transaction."""
CLAIM_BATCH = 20
"""Groups one sender claims per pass; each costs at most one bounded call."""


def _queries() -> dict[str, str]:
    return load_queries("alert_incidents")


@dataclass
class _Group:
    count: int
    first_seen: datetime
    last_seen: datetime


def count_new_dead_letters(conn: Connection, sink: str) -> int:
    """Count the dead letters written since the last pass into ``sink``'s groups.

    Returns how many were taken off the outbox. Rows already replayed or discarded by
    the time they are counted open nothing. Each batch is one transaction: the rows
    leave the outbox in the transaction that counts them.
    """
    taken = 0
    while True:
        with conn, conn.cursor() as cur:
            cur.execute(_queries()["take_outbox"], {"limit": OUTBOX_BATCH})
            rows = cur.fetchall()
            groups: dict[tuple[str, str, str], _Group] = {}
            for _id, queue, kind, error_type, status, created_at in rows:
                if status != PENDING_REVIEW:
                    continue
                group = groups.get((queue, kind, error_type))
                if group is None:
                    groups[(queue, kind, error_type)] = _Group(1, created_at, created_at)
                else:
                    group.count += 1
                    group.first_seen = min(group.first_seen, created_at)
                    group.last_seen = max(group.last_seen, created_at)
            # sorted: two senders upserting the same groups lock them in one order
            for (queue, kind, error_type), group in sorted(groups.items()):
                cur.execute(
                    _queries()["count_into_group"],
                    {
                        "sink": sink,
                        "queue": queue,
                        "kind": kind,
                        "error_type": error_type,
                        "first_seen": group.first_seen,
                        "last_seen": group.last_seen,
                        "count": group.count,
                    },
                )
        taken += len(rows)
        if len(rows) < OUTBOX_BATCH:
            return taken


def drain_outbox(conn: Connection) -> int:
    """Empty the outbox without counting (no sink is set): it must not grow forever."""
    taken = 0
    while True:
        with conn, conn.cursor() as cur:
            cur.execute(_queries()["take_outbox"], {"limit": OUTBOX_BATCH})
            count = len(cur.fetchall())
        taken += count
        if count < OUTBOX_BATCH:
            return taken


def resolve_fixed_groups(conn: Connection, sink: str) -> list[tuple[int, str | None, str]]:
    """Resolve every open group of ``sink`` with no dead letter pending review left.

    Returns ``(group id, incident id or None, note)`` for each group resolved. The note
    says what became of the rows (replayed, discarded and why) and, when a bulk
    operation was running as the last of them changed, which one and who ran it.
    """
    resolved: list[tuple[int, str | None, str]] = []
    with conn, conn.cursor() as cur:
        cur.execute(_queries()["open_groups"], {"sink": sink})
        open_groups = cur.fetchall()
    for group_id, queue, kind, error_type, opened_at, dead_letters in open_groups:
        key = {"queue": queue, "kind": kind, "error_type": error_type}
        with conn, conn.cursor() as cur:
            cur.execute(_queries()["group_has_pending"], key)
            row = cur.fetchone()
            if row is None or row[0]:
                continue
            note = _resolve_note(cur, key, opened_at)
            cur.execute(
                _queries()["resolve_group"],
                {"id": group_id, "dead_letters": dead_letters, "note": note},
            )
            done = cur.fetchone()
        if done is not None:
            resolved.append((group_id, done[1], note))
    return resolved


def _resolve_note(cur: Any, key: dict[str, str], opened_at: datetime) -> str:
    cur.execute(_queries()["group_outcome"], {**key, "opened_at": opened_at})
    replayed, discarded, discard_reason, last_change = cur.fetchone()
    parts = []
    if replayed:
        parts.append(f"{replayed} replayed")
    if discarded:
        reason = f" ({discard_reason})" if discard_reason else ""
        parts.append(f"{discarded} discarded{reason}")
    what = ", ".join(parts) or "no dead letter pending review"
    by = ""
    if last_change is not None:
        cur.execute(_queries()["operation_at"], {"at": last_change})
        operation = cur.fetchone()
        if operation is not None:
            by = f" by bulk {operation[1]} operation {operation[0]} ({operation[2]})"
    return f"platform-tasks: {what}{by}"


@dataclass(frozen=True)
class Claimed:
    """A group leased to this sender for one call."""

    id: int
    to_send: str
    incident_id: str | None
    queue: str
    kind: str
    error_type: str
    opened_at: datetime
    last_seen_at: datetime
    dead_letters: int
    resolve_note: str | None
    attempts: int


def claim_due(conn: Connection, sink: str, *, lease_seconds: float) -> list[Claimed]:
    """Lease the groups of ``sink`` whose call is due (at most :data:`CLAIM_BATCH`)."""
    with conn, conn.cursor() as cur:
        cur.execute(
            _queries()["claim_due"],
            {"sink": sink, "lease_seconds": lease_seconds, "limit": CLAIM_BATCH},
        )
        return [Claimed(*row) for row in cur.fetchall()]


@dataclass(frozen=True)
class GroupSummary:
    """The group's dead letters pending review, as an incident describes them."""

    pending: int
    tenants: int
    some_tenants: Sequence[str]
    first_seen: datetime | None
    last_seen: datetime | None
    example_id: int | None
    example_job_id: uuid.UUID | None
    reason: str | None


def group_summary(conn: Connection, group: Claimed) -> GroupSummary:
    with conn, conn.cursor() as cur:
        cur.execute(
            _queries()["group_summary"],
            {"queue": group.queue, "kind": group.kind, "error_type": group.error_type},
        )
        row = cur.fetchone()
    assert row is not None
    pending, tenants, some, first, last, example_id, job_id, reason = row
    return GroupSummary(
        pending=int(pending),
        tenants=int(tenants),
        some_tenants=list(some or []),
        first_seen=first,
        last_seen=last,
        example_id=example_id,
        example_job_id=uuid.UUID(str(job_id)) if job_id is not None else None,
        reason=reason,
    )


def record_opened(conn: Connection, group_id: int, incident_id: str) -> None:
    with conn, conn.cursor() as cur:
        cur.execute(_queries()["record_opened"], {"id": group_id, "incident_id": incident_id})


def record_resolved(conn: Connection, group_id: int) -> None:
    with conn, conn.cursor() as cur:
        cur.execute(_queries()["record_resolved"], {"id": group_id})


def record_failed(conn: Connection, group_id: int, error: str, *, retry_seconds: float) -> None:
    with conn, conn.cursor() as cur:
        cur.execute(
            _queries()["record_failed"],
            {"id": group_id, "error": error, "retry_seconds": retry_seconds},
        )
