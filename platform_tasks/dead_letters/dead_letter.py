"""One dead letter: a failure the consumer records, and the row of core.dead_letters it becomes.

:class:`DeadLetter` is both. The consumer (and every other writer) builds one from what it
knows about the failure and calls :meth:`DeadLetter.write`; what only the table decides
(``id``, ``status``, timestamps, replay and discard bookkeeping) is left at its defaults
until the row is read back, and every read of
:mod:`~platform_tasks.dead_letters.store` fills it. One class for both means a field
added to the table is added once, and what a writer sets is by construction what a
reader gets.

The write lives here rather than in the store so that the consumer, which only writes,
never imports replay, and so that the store can import this module without a cycle.
PostgreSQL refuses NUL characters in ``text`` and ``jsonb``, yet a message can carry them
anywhere: every value is made storable first (one rule for every dead-letter write), so
the row can always be written and nothing is lost.
"""

from __future__ import annotations

import base64
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from psycopg2.extensions import cursor as Cursor
from psycopg2.extras import Json

from platform_tasks.observability.alerts import send_alert
from platform_tasks.postgres.queries import load_queries

logger = logging.getLogger(__name__)

PENDING_REVIEW = "pending_review"
"""The status of a row nobody has acted on yet: the one the table gives a new row."""

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


@dataclass(frozen=True, kw_only=True)
class DeadLetter:
    """A job that will not be retried: what a writer records, and what the row says.

    The fields up to ``reason`` are the failure's content and are required. ``headers``
    (trace context and custom headers, republished by a replay) may be absent. The rest
    exist only once the row is stored and keep their defaults on a dead letter that has
    not been written; reads from the table fill every one of them.
    """

    job_id: uuid.UUID | None
    queue: str | None
    kind: str | None
    tenant_id: str | None
    correlation_id: str | None
    payload: Any
    """The job's envelope, or what could be read of a message that was not one (see
    :func:`~platform_tasks.dead_letters.records.raw_payload`). Any JSON as far as the
    table goes; ``None`` on a row read without it (a listing's summary)."""
    attempts: int
    last_error: str | None
    """Error type, message and traceback; a writer always sets it, the column allows NULL."""
    error_type: str | None
    reason: str
    headers: dict[str, Any] | None = None
    """Trace context and custom headers of the message, republished by a replay."""

    id: int | None = None
    """Set by the table; ``None`` until the row is written and read back."""
    status: str = PENDING_REVIEW
    created_at: datetime | None = None
    updated_at: datetime | None = None
    replay_count: int = 0
    replayed_at: datetime | None = None
    discard_reason: str | None = None
    discarded_at: datetime | None = None

    @classmethod
    def from_row(cls, names: Sequence[str], values: Sequence[Any]) -> DeadLetter:
        """The dead letter of one row read from core.dead_letters, by column name."""
        row = dict(zip(names, values, strict=True))
        if row["job_id"] is not None:
            row["job_id"] = uuid.UUID(str(row["job_id"]))
        return cls(**row)

    def write(self, cursor: Cursor) -> int:
        """Insert the row in the cursor's transaction and return its id; the caller commits.

        :func:`insert_dead_letter` makes every value storable (NUL and lone surrogates
        written out as text, the paths recorded), so this write cannot fail on what the
        message carried. Only the content fields are written: the table sets the rest.
        """
        return insert_dead_letter(
            cursor,
            job_id=self.job_id,
            queue=self.queue,
            kind=self.kind,
            tenant_id=self.tenant_id,
            payload=self.payload,
            attempts=self.attempts,
            last_error=self.last_error,
            error_type=self.error_type,
            reason=self.reason,
            correlation_id=self.correlation_id,
            headers=self.headers,
        )

    def alert(self, dead_letter_id: int, exc: BaseException | None = None) -> None:
        """Tell operators; grouped by queue + kind + error type, so a storm is one issue."""
        send_alert(
            f"job dead-lettered ({self.reason}): {self.error_type or 'error'} "
            f"in {self.kind or '<unknown kind>'} on queue {self.queue or '<unknown>'} "
            f"[dead letter {dead_letter_id}]",
            tags={
                "queue": self.queue,
                "kind": self.kind,
                "tenant_id": self.tenant_id,
                "job_id": str(self.job_id) if self.job_id else None,
                "correlation_id": self.correlation_id,
                "reason": self.reason,
            },
            fingerprint=[
                "platform-dead-letter",
                self.queue or "",
                self.kind or "",
                self.error_type or self.reason,
            ],
            exc=exc,
        )

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


def insert_dead_letter(
    cursor: Cursor,
    *,
    job_id: uuid.UUID | None,
    queue: str | None,
    kind: str | None,
    tenant_id: str | None,
    payload: Any,
    attempts: int,
    last_error: str | None,
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
    texts, value, escaped = _storable_columns(
        payload,
        {
            "queue": queue,
            "kind": kind,
            "tenant_id": tenant_id,
            "last_error": last_error,
            "error_type": error_type,
            "reason": reason,
            "correlation_id": correlation_id,
        },
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
    _log_inserted(dead_letter_id, job_id, reason, texts, escaped)
    return dead_letter_id


def _storable_columns(
    payload: Any, columns: dict[str, str | None]
) -> tuple[dict[str, str | None], Any, list[str]]:
    """Every text column and the payload made storable, and what had to be escaped.

    A job that could not be stored as it is must still become a dead letter, so escapes
    are recorded rather than refused: listed under :data:`ESCAPED_KEY` in the payload and
    at the end of ``last_error``, where a person reviewing the row sees them.
    """
    stored = storable_payload(payload)
    escaped = list(stored.escaped)
    texts: dict[str, str | None] = {}
    for column, text_value in columns.items():
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
    return texts, value, escaped


def _log_inserted(
    dead_letter_id: int,
    job_id: uuid.UUID | None,
    reason: str,
    texts: dict[str, str | None],
    escaped: list[str],
) -> None:
    """Log the new row with the stored (escaped) column values, never the raw ones, so a
    log line cannot carry what the database would not."""
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
