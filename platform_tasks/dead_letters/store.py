"""The dead-letter repository: list, show, replay and discard rows of core.dead_letters.

A dead letter is a job that will not be retried: its envelope (or, for a message that was not
a readable envelope, what could be read of it) waits here for an operator. Rows are written
by :meth:`DeadLetter.write <platform_tasks.dead_letters.dead_letter.DeadLetter.write>` and
read back here as :class:`~platform_tasks.dead_letters.dead_letter.DeadLetter`. Replay is written
so that two operators replaying the same rows at once publish each row once: rows are locked
with ``FOR UPDATE SKIP LOCKED``, published, marked ``replayed`` and committed in one
transaction per batch.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from psycopg2.extensions import connection as Connection
from psycopg2.extensions import cursor as Cursor

from platform_tasks.dead_letters.dead_letter import ESCAPED_KEY, PENDING_REVIEW, DeadLetter
from platform_tasks.envelope import parse_envelope
from platform_tasks.errors import EnvelopeError, ReplayError
from platform_tasks.observability.reserved_headers import without_reserved
from platform_tasks.observability.trace_context import without_publish_time
from platform_tasks.postgres.queries import load_queries

logger = logging.getLogger(__name__)

STATUSES = (PENDING_REVIEW, "replayed", "discarded")
REPLAY_BATCH_SIZE = 100
STREAM_BATCH_SIZE = 100
"""Rows fetched per round trip by the server-side cursors of ``list --json`` and dry runs,
so memory holds one batch of payloads, never the whole selection."""

Publish = Callable[..., object]
"""Publishes one envelope to a queue, e.g. ``QueuePort(app).publish``: called as
``publish(queue, envelope)``, or ``publish(queue, envelope, {"headers": {...}})`` for a row
stored with headers (its trace context and the publisher's custom headers)."""


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


@dataclass(frozen=True)
class ReplayedRow:
    id: int
    job_id: uuid.UUID
    queue: str


@dataclass
class ReplayReport:
    """What a replay did (or, for a dry run, would do)."""

    dry_run: bool
    replayed: list[ReplayedRow] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    """``(id, why)`` for pending rows that cannot be replayed (e.g. not an envelope)."""
    not_pending: list[tuple[int, str]] = field(default_factory=list)
    """``(id, status or 'not found')`` for explicitly named ids that were not acted on."""


@dataclass
class DiscardReport:
    discarded: list[int] = field(default_factory=list)
    not_pending: list[tuple[int, str]] = field(default_factory=list)


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


def replay_refusal(queue: str | None, payload: Any, *, max_bytes: int | None = None) -> str | None:
    """Why a row cannot be replayed, or ``None`` when it can.

    Only a readable envelope with a known queue can be republished as the original job;
    a raw poison message has no envelope to republish. The envelope is held to the same
    rules as a publish (the size limit is ``max_bytes``, default the current setting),
    so a row that publish would refuse is refused here with the reason.
    """
    if not queue:
        return "no original queue recorded"
    if isinstance(payload, dict) and "raw" in payload and "job_id" not in payload:
        return "payload is a raw message, not a readable envelope"
    if isinstance(payload, dict) and ESCAPED_KEY in payload:
        return (
            "payload was stored with escapes, so it is not the original envelope "
            f"({'; '.join(map(str, payload[ESCAPED_KEY]))})"
        )
    try:
        parse_envelope(payload, dict, max_bytes=max_bytes)
    except EnvelopeError as exc:
        return f"payload is not a readable envelope ({exc})"
    return None


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
) -> ReplayReport:
    """Republish pending rows (by ``ids`` and/or ``where``) and mark them ``replayed``.

    Each batch is one transaction: lock the rows (skipping rows another replay holds),
    publish each envelope to its original queue with its original job id, mark them, commit.
    A row whose publish fails is not marked, so it stays ``pending_review``; the rows
    published before it are committed as replayed and :class:`ReplayError` is raised.
    If the commit itself fails after publishing, those rows stay pending and a later
    replay publishes them again: the consumer's idempotency row makes that harmless.
    ``where.status`` is ignored: only ``pending_review`` rows are ever replayed.

    ``open_publish`` (instead of ``publish``) is called once, when the first replayable
    row is locked, so a replay that matches nothing imports no application and opens no
    broker connection; its errors propagate unchanged (the batch is rolled back). A dry
    run publishes nothing and streams its candidates through a server-side cursor.
    """
    where = where or DeadLetterFilter()
    params = _replay_params(ids, where)
    report = ReplayReport(dry_run=dry_run)
    queries = _queries()
    if dry_run:
        with conn, conn.cursor(name="platform_dead_letters_dry_run") as cur:
            cur.itersize = STREAM_BATCH_SIZE
            cur.execute(queries["select_replay_candidates"], params)
            for row_id, _job_id, queue, _kind, _tenant, payload, _headers in cur:
                refusal = replay_refusal(queue, payload, max_bytes=max_bytes)
                if refusal:
                    report.refused.append((row_id, refusal))
                else:
                    report.replayed.append(
                        ReplayedRow(row_id, uuid.UUID(str(payload["job_id"])), queue)
                    )
        if ids:
            acted = {r.id for r in report.replayed} | {i for i, _ in report.refused}
            with conn, conn.cursor() as cur:
                report.not_pending = _not_pending(cur, ids, acted)
        return report
    if publish is None and open_publish is None:
        raise ValueError("replay needs publish or open_publish")

    after_id = 0
    while True:
        with conn, conn.cursor() as cur:
            cur.execute(
                queries["lock_replay_batch"], {**params, "after_id": after_id, "limit": batch_size}
            )
            rows = cur.fetchall()
            if not rows:
                break
            published: list[ReplayedRow] = []
            for row_id, _job_id, queue, _kind, _tenant, payload, headers in rows:
                refusal = replay_refusal(queue, payload, max_bytes=max_bytes)
                if refusal:
                    report.refused.append((row_id, refusal))
                    _log_refused(row_id, refusal)
                    continue
                if publish is None:
                    assert open_publish is not None
                    publish = open_publish()
                try:
                    job_id = uuid.UUID(str(_republish(publish, queue, payload, headers)))
                except Exception as exc:
                    _mark_replayed(cur, published, now)
                    conn.commit()
                    report.replayed.extend(published)
                    done = [r.id for r in report.replayed]
                    raise ReplayError(row_id, done, exc) from exc
                published.append(ReplayedRow(row_id, job_id, queue))
            _mark_replayed(cur, published, now)
        report.replayed.extend(published)
        for replayed in published:
            _log_replayed(replayed)
        after_id = rows[-1][0]
    if ids:
        acted = {r.id for r in report.replayed} | {i for i, _ in report.refused}
        with conn, conn.cursor() as cur:
            report.not_pending = _not_pending(cur, ids, acted)
    return report


def _republish(publish: Publish, queue: str, payload: Any, headers: Any) -> object:
    """Publish a row again with the trace context and custom headers it was stored with
    (less any name Celery or the platform uses, kept by a row stored before such names
    were refused: it would replace their own header).

    Not with its publish time: a replay is a new publish, so a cancel rule made before
    it (the incident's "cancel, fix, replay") does not take it."""
    if isinstance(headers, dict):
        headers = without_reserved(headers)
    if isinstance(headers, dict) and headers:
        return publish(queue, payload, {"headers": without_publish_time(headers)})
    return publish(queue, payload)


def _mark_replayed(cur: Cursor, published: list[ReplayedRow], now: datetime | None) -> None:
    if not published:
        return
    cur.execute(
        _queries()["mark_replayed"],
        {"ids": [r.id for r in published], "now": now or datetime.now(UTC)},
    )


def _log_replayed(row: ReplayedRow) -> None:
    logger.info(
        "dead letter %s replayed as job %s to queue %s",
        row.id,
        row.job_id,
        row.queue,
        extra={
            "event": "dead_letter.replayed",
            "dead_letter_id": row.id,
            "job_id": str(row.job_id),
            "queue": row.queue,
        },
    )


def _log_refused(row_id: int, why: str) -> None:
    logger.warning(
        "dead letter %s not replayed: %s",
        row_id,
        why,
        extra={"event": "dead_letter.replay_refused", "dead_letter_id": row_id},
    )


def discard_dead_letters(
    conn: Connection, ids: Sequence[int], *, reason: str, now: datetime | None = None
) -> DiscardReport:
    """Mark pending rows ``discarded`` with the operator's reason; others are reported."""
    if not reason.strip():
        raise ValueError("a discard reason is required")
    report = DiscardReport()
    with conn, conn.cursor() as cur:
        cur.execute(
            _queries()["discard_dead_letters"],
            {"ids": list(ids), "reason": reason, "now": now or datetime.now(UTC)},
        )
        report.discarded = sorted(int(row[0]) for row in cur.fetchall())
        report.not_pending = _not_pending(cur, ids, set(report.discarded))
    for row_id in report.discarded:
        logger.info(
            "dead letter %s discarded: %s",
            row_id,
            reason,
            extra={"event": "dead_letter.discarded", "dead_letter_id": row_id},
        )
    return report
