"""The dead-letter repository: write, list, show, replay and discard rows of core.dead_letters.

A dead letter is a job that will not be retried: its envelope (or, for a message that was not
a readable envelope, what could be read of it) waits here for an operator. Replay is written
so that two operators replaying the same rows at once publish each row once: rows are locked
with ``FOR UPDATE SKIP LOCKED``, published, marked ``replayed`` and committed in one
transaction per batch.
"""

from __future__ import annotations

import base64
import logging
import math
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from psycopg2.extensions import connection as Connection
from psycopg2.extensions import cursor as Cursor
from psycopg2.extras import Json

from platform_tasks.envelope import parse_envelope
from platform_tasks.errors import EnvelopeError, ReplayError
from platform_tasks.postgres.queries import load_queries

logger = logging.getLogger(__name__)

STATUSES = ("pending_review", "replayed", "discarded")
REPLAY_BATCH_SIZE = 100
STREAM_BATCH_SIZE = 100
"""Rows fetched per round trip by the server-side cursors of ``list --json`` and dry runs,
so memory holds one batch of payloads, never the whole selection."""

Publish = Callable[..., object]
"""Publishes one envelope to a queue, e.g. ``QueuePort(app).publish``: called as
``publish(queue, envelope)``, or ``publish(queue, envelope, {"headers": {...}})`` for a row
stored with headers (its trace context and the publisher's custom headers)."""


ESCAPED_KEY = "platform_escaped"
"""Key added to a stored payload whose text had to be escaped to be storable: it lists
the path of each escaped value, so nobody mistakes the row for the original message."""


def _queries() -> dict[str, str]:
    return load_queries("dead_letters")


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def storable_text(text: str) -> tuple[str, str | None]:
    """``text`` as PostgreSQL can store it, and what was escaped (``None`` when nothing).

    PostgreSQL stores neither NUL (in ``text`` or ``jsonb``) nor a lone UTF-16 surrogate
    (which a JSON body may spell ``"\\ud800"``): each becomes its escape written out as
    text (NUL is stored as the six characters ``\\u0000``).
    """
    nul = "\x00" in text
    if not nul and not _unencodable(text):
        return text, None
    out = []
    surrogate = False
    for char in text:
        if char == "\x00":
            out.append("\\u0000")
        elif 0xD800 <= ord(char) <= 0xDFFF:
            surrogate = True
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    what = " and ".join(
        name for name, found in (("NUL", nul), ("lone surrogate", surrogate)) if found
    )
    return "".join(out), what


@dataclass(frozen=True)
class StorablePayload:
    """A payload rewritten so ``jsonb`` accepts it, with the paths of what was rewritten."""

    value: Any
    escaped: list[str]


def storable_payload(payload: Any) -> StorablePayload:
    """Make any payload storable in ``jsonb``, recording each change by its dotted path.

    Strings and keys lose NUL and lone surrogates (see :func:`storable_text`), non-finite
    floats (``NaN`` is valid to Python's JSON, not to PostgreSQL) become their text, bytes
    become base64 text, and anything else that is not JSON becomes its ``repr``. A payload
    that needs none of this is returned as it is.
    """
    escaped: list[str] = []
    value = _storable(payload, "", escaped)
    return StorablePayload(value, escaped)


def _storable(value: Any, path: str, escaped: list[str]) -> Any:
    where = path or "<payload>"
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        text, what = storable_text(value)
        if what:
            escaped.append(f"{where} ({what})")
        return text
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        escaped.append(f"{where} (non-finite number)")
        return str(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = key if isinstance(key, str) else str(key)
            name, what = storable_text(name)
            child = f"{path}.{name}" if path else name
            if what:
                escaped.append(f"{child} (key: {what})")
            out[name] = _storable(item, child, escaped)
        return out
    if isinstance(value, list | tuple):
        return [
            _storable(item, f"{path}.{index}" if path else str(index), escaped)
            for index, item in enumerate(value)
        ]
    if isinstance(value, bytes | bytearray):
        escaped.append(f"{where} (bytes as base64)")
        return base64.b64encode(bytes(value)).decode("ascii")
    escaped.append(f"{where} ({type(value).__name__} as repr)")
    text, _ = storable_text(repr(value))
    return text


@dataclass(frozen=True)
class DeadLetter:
    """One row of core.dead_letters."""

    id: int
    job_id: uuid.UUID | None
    queue: str | None
    kind: str | None
    tenant_id: str | None
    payload: Any
    attempts: int
    last_error: str | None
    error_type: str | None
    reason: str
    status: str
    correlation_id: str | None
    created_at: datetime
    updated_at: datetime
    replay_count: int
    replayed_at: datetime | None
    discard_reason: str | None
    discarded_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict for ``--json`` output."""
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, uuid.UUID):
                value = str(value)
            out[item.name] = value
        return out


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


def insert_dead_letter(
    cursor: Cursor,
    *,
    job_id: uuid.UUID | None,
    queue: str | None,
    kind: str | None,
    tenant_id: str | None,
    payload: Any,
    attempts: int,
    last_error: str,
    error_type: str | None,
    reason: str,
    correlation_id: str | None,
    headers: Mapping[str, Any] | None = None,
) -> int:
    """Insert one ``pending_review`` row and return its id; the caller commits.

    Taking a cursor lets the consumer write the row in the same transaction as anything
    else it records about the failure. Every value is first made storable (a job that
    could not be stored as it is must still become a dead letter, not a failed write
    that leaves the job unrecorded): escaped values are listed under
    :data:`ESCAPED_KEY` in the stored payload and at the end of ``last_error``.
    """
    stored = storable_payload(payload)
    escaped = list(stored.escaped)
    texts: dict[str, str | None] = {}
    for column, text_value in (
        ("queue", queue),
        ("kind", kind),
        ("tenant_id", tenant_id),
        ("last_error", last_error),
        ("error_type", error_type),
        ("reason", reason),
        ("correlation_id", correlation_id),
    ):
        if text_value is None:
            texts[column] = None
            continue
        text, what = storable_text(str(text_value))
        if what:
            escaped.append(f"column {column} ({what})")
        texts[column] = text
    value: Any = stored.value
    if escaped:
        value = dict(value) if isinstance(value, dict) else {"value": value}
        value[ESCAPED_KEY] = escaped
        texts["last_error"] = (
            f"{texts['last_error'] or ''}\n(stored with escapes: {'; '.join(escaped)})"
        )
    cursor.execute(
        _queries()["insert_dead_letter"],
        {
            **texts,
            "job_id": str(job_id) if job_id is not None else None,
            "payload": Json(value),
            "attempts": attempts,
            "headers": Json(storable_payload(dict(headers)).value) if headers else None,
        },
    )
    row = cursor.fetchone()
    assert row is not None
    dead_letter_id = int(row[0])
    logger.info(
        "dead letter %s written for job %s (%s)",
        dead_letter_id,
        job_id,
        reason,
        extra={
            "event": "dead_letter.inserted",
            "dead_letter_id": dead_letter_id,
            "job_id": str(job_id) if job_id else None,
            "queue": texts["queue"],
            "kind": texts["kind"],
            "reason": texts["reason"],
            "escaped": escaped or None,
        },
    )
    return dead_letter_id


def _dead_letter(names: Sequence[str], values: Sequence[Any]) -> DeadLetter:
    row = dict(zip(names, values, strict=True))
    if row["job_id"] is not None:
        row["job_id"] = uuid.UUID(str(row["job_id"]))
    return DeadLetter(**row)


def _rows(cursor: Cursor) -> list[DeadLetter]:
    names = [column[0] for column in cursor.description or ()]
    return [_dead_letter(names, values) for values in cursor.fetchall()]


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
            yield _dead_letter(names, values)


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
    """Publish a row again with the trace context and custom headers it was stored with."""
    if isinstance(headers, dict) and headers:
        return publish(queue, payload, {"headers": headers})
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
