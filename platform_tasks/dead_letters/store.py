"""The dead-letter repository: list, show, replay and discard rows of core.dead_letters.

A dead letter is a job that will not be retried: its envelope (or, for a message that was not
a readable envelope, what could be read of it) waits here for an operator. Rows are written
by :meth:`DeadLetter.write <platform_tasks.dead_letters.dead_letter.DeadLetter.write>` and
read back here as :class:`~platform_tasks.dead_letters.dead_letter.DeadLetter`. Replay and
discard by id select the rows and hand them to the batch step every replay and discard
shares (:func:`~platform_tasks.dead_letters.batch.settle_batch`), so two operators
replaying the same rows at once publish each row once: rows are locked with ``FOR UPDATE
SKIP LOCKED``, published, marked ``replayed`` and committed in one transaction per batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg2.extensions import connection as Connection
from psycopg2.extensions import cursor as Cursor

from platform_tasks.dead_letters.batch import (
    Discard,
    Outcome,
    Publish,
    Replay,
    ReplayedRow,
    replay_refusal,
    settle_batch,
)
from platform_tasks.dead_letters.dead_letter import PENDING_REVIEW, DeadLetter
from platform_tasks.errors import ReplayError
from platform_tasks.postgres.queries import load_queries

__all__ = [
    "REPLAY_BATCH_SIZE",
    "STATUSES",
    "STREAM_BATCH_SIZE",
    "DeadLetterFilter",
    "DiscardReport",
    "Publish",
    "ReplayReport",
    "ReplayedRow",
    "discard_dead_letters",
    "get_dead_letter",
    "iter_dead_letters",
    "list_dead_letters",
    "replay_dead_letters",
    "replay_refusal",
]

STATUSES = (PENDING_REVIEW, "replayed", "discarded")
REPLAY_BATCH_SIZE = 100
STREAM_BATCH_SIZE = 100
"""Rows fetched per round trip by the server-side cursors of ``list --json`` and dry runs,
so memory holds one batch of payloads, never the whole selection."""

ReplayReport = Outcome
"""What a replay by id did: the one outcome type of replay and discard."""
DiscardReport = Outcome
"""What a discard by id did: the one outcome type of replay and discard."""


def _queries() -> dict[str, str]:
    return load_queries("dead_letters")


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which rows an operator means; ``None`` matches anything."""

    queue: str | None = None
    kind: str | None = None
    tenant_id: str | None = None
    status: str | None = None
    since: datetime | None = None

    def params(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "kind": self.kind,
            "tenant_id": self.tenant_id,
            "status": self.status,
            "since": self.since,
        }

    @property
    def is_empty(self) -> bool:
        return all(value is None for value in self.params().values())


def _rows(cursor: Cursor) -> list[DeadLetter]:
    names = [column[0] for column in cursor.description or ()]
    return [DeadLetter.from_row(names, values) for values in cursor.fetchall()]


def _list_params(where: DeadLetterFilter | None, limit: int) -> dict[str, Any]:
    params = (where or DeadLetterFilter()).params()
    params["limit"] = limit
    return params


def list_dead_letters(
    cursor: Cursor,
    where: DeadLetterFilter | None = None,
    *,
    limit: int = 100,
    with_payload: bool = True,
) -> list[DeadLetter]:
    """Rows matching ``where``, newest first, at most ``limit``.

    ``with_payload=False`` leaves ``payload`` out (``None``) and ``last_error`` cut to its
    start: what a table shows, without reading every payload into memory.
    """
    query = "list_dead_letters" if with_payload else "list_dead_letter_summaries"
    cursor.execute(_queries()[query], _list_params(where, limit))
    return _rows(cursor)


def iter_dead_letters(
    conn: Connection,
    where: DeadLetterFilter | None = None,
    *,
    limit: int = 100,
    batch_size: int = STREAM_BATCH_SIZE,
) -> Iterator[DeadLetter]:
    """Like :func:`list_dead_letters` with payloads, streamed through a server-side cursor.

    Memory holds ``batch_size`` rows at a time whatever ``limit`` is. The rows are read
    in one read-only transaction, ended when the iterator is exhausted or closed.
    """
    with conn, conn.cursor(name="platform_dead_letters_list") as cur:
        cur.itersize = batch_size
        cur.execute(_queries()["list_dead_letters"], _list_params(where, limit))
        names: list[str] | None = None
        for values in cur:
            if names is None:
                names = [column[0] for column in cur.description or ()]
            yield DeadLetter.from_row(names, values)


def get_dead_letter(cursor: Cursor, dead_letter_id: int) -> DeadLetter | None:
    cursor.execute(_queries()["get_dead_letter"], {"id": dead_letter_id})
    rows = _rows(cursor)
    return rows[0] if rows else None


def _not_pending(cursor: Cursor, ids: Sequence[int], acted_on: set[int]) -> list[tuple[int, str]]:
    missing = [i for i in ids if i not in acted_on]
    if not missing:
        return []
    cursor.execute(_queries()["statuses_of"], {"ids": list(missing)})
    found = dict(cursor.fetchall())
    return [(i, found.get(i, "not found")) for i in sorted(set(missing))]


def _replay_params(ids: Sequence[int] | None, where: DeadLetterFilter) -> dict[str, Any]:
    params = where.params()
    params.pop("status")
    params["ids"] = list(ids) if ids else None
    return params


def replay_dead_letters(
    conn: Connection,
    publish: Publish | None = None,
    *,
    open_publish: Callable[[], Publish] | None = None,
    ids: Sequence[int] | None = None,
    where: DeadLetterFilter | None = None,
    dry_run: bool = False,
    batch_size: int = REPLAY_BATCH_SIZE,
    max_bytes: int | None = None,
    now: datetime | None = None,
) -> Outcome:
    """Republish pending rows (by ``ids`` and/or ``where``) and mark them ``replayed``.

    Each batch is one transaction of the batch step
    (:func:`~platform_tasks.dead_letters.batch.settle_batch`): lock the rows (skipping
    rows another replay holds), publish each envelope to its original queue with its
    original job id and stored headers, mark them, commit. A row whose publish fails is not
    marked, so it stays ``pending_review``; the rows published before it are committed as
    replayed and :class:`ReplayError` is raised. If the commit itself fails after
    publishing, those rows stay pending and a later replay publishes them again: the
    consumer's idempotency row makes that harmless. ``where.status`` is ignored: only
    ``pending_review`` rows are ever replayed.

    ``open_publish`` (instead of ``publish``) is called once, when the first replayable
    row is locked, so a replay that matches nothing imports no application and opens no
    broker connection; its errors propagate unchanged (the batch is rolled back). A dry
    run publishes nothing and streams its candidates through a server-side cursor.
    """
    where = where or DeadLetterFilter()
    params = _replay_params(ids, where)
    if dry_run:
        report = _dry_run(conn, params, max_bytes)
    else:
        action = Replay(publish, open_publish=open_publish, max_bytes=max_bytes)
        report = Outcome()
        lock = _queries()["lock_replay_batch"]
        after_id = 0
        while True:
            batch = settle_batch(
                conn, lock, {**params, "after_id": after_id, "limit": batch_size}, action, now=now
            )
            report.add(batch)
            if batch.stopped is not None:
                row_id, cause = batch.stopped
                raise ReplayError(row_id, [r.id for r in report.replayed], cause) from cause
            if not batch.locked:
                break
            after_id = batch.locked[-1]
    if ids:
        acted = {r.id for r in report.replayed} | {i for i, _ in report.refused}
        with conn, conn.cursor() as cur:
            report.not_pending = _not_pending(cur, ids, acted)
    return report


def _dry_run(conn: Connection, params: dict[str, Any], max_bytes: int | None) -> Outcome:
    report = Outcome(dry_run=True)
    with conn, conn.cursor(name="platform_dead_letters_dry_run") as cur:
        cur.itersize = STREAM_BATCH_SIZE
        cur.execute(_queries()["select_replay_candidates"], params)
        for row_id, _job_id, queue, _kind, _tenant, payload, _headers in cur:
            refusal = replay_refusal(queue, payload, max_bytes=max_bytes)
            if refusal:
                report.refused.append((row_id, refusal))
            else:
                report.replayed.append(
                    ReplayedRow(row_id, uuid.UUID(str(payload["job_id"])), queue)
                )
    return report


def discard_dead_letters(
    conn: Connection, ids: Sequence[int], *, reason: str, now: datetime | None = None
) -> Outcome:
    """Mark pending rows ``discarded`` with the operator's reason; others are reported.

    One transaction of the batch step, which waits for a replay holding one of the rows
    (a row it commits as replayed is reported as such)."""
    if not reason.strip():
        raise ValueError("a discard reason is required")
    report = settle_batch(
        conn,
        _queries()["lock_pending"],
        {"ids": list(ids), "payloads": False},
        Discard(reason),
        now=now,
    )
    with conn, conn.cursor() as cur:
        report.not_pending = _not_pending(cur, ids, set(report.discarded))
    return report
