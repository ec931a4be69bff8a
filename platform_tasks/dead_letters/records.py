"""Dead-letter records: what a row says about a failure, in a form that can always be stored.

The repository (:mod:`platform_tasks.dead_letters.store`) owns the table; this module decides
what goes in it when a consumer gives up on a job: the error as type, message and
traceback, the raw form of a message that was not a readable envelope, and one alert
grouped by queue + kind + error type so a storm of one failure is one Sentry issue.

PostgreSQL refuses NUL characters in ``text`` and ``jsonb``, yet a message can carry them
anywhere: the repository's insert writes them out as text (one rule for every dead-letter
write), so the row can always be written and nothing is lost.
"""

from __future__ import annotations

import base64
import json
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

from platform_tasks.dead_letters.store import insert_dead_letter
from platform_tasks.observability.alerts import send_alert

# FOR SHARE waits for a replay that holds the row (it publishes, then commits the row
# as replayed): without it a fast consumer of the replayed message could read the row
# still pending and drop the replay as "already dead-lettered".
_LATEST = (
    "SELECT id, status FROM core.dead_letters WHERE job_id = %s AND kind IS NOT DISTINCT FROM %s "
    "ORDER BY id DESC LIMIT 1 FOR SHARE"
)


@dataclass(frozen=True)
class DeadLetterRecord:
    """Everything one dead-letter row and its alert carry."""

    job_id: uuid.UUID | None
    queue: str | None
    kind: str | None
    tenant_id: str | None
    correlation_id: str | None
    payload: dict[str, Any]
    attempts: int
    last_error: str
    error_type: str | None
    reason: str
    headers: dict[str, Any] | None = None
    """Trace context and custom headers of the message, republished by a replay."""

    def write(self, cursor: Any) -> int:
        """Insert the row in the cursor's transaction; the caller commits.

        :func:`~platform_tasks.dead_letters.store.insert_dead_letter` makes every value storable
        (NUL and lone surrogates written out as text, the paths recorded), so this write
        cannot fail on what the message carried.
        """
        record = self
        return insert_dead_letter(
            cursor,
            job_id=record.job_id,
            queue=record.queue,
            kind=record.kind,
            tenant_id=record.tenant_id,
            payload=record.payload,
            attempts=record.attempts,
            last_error=record.last_error,
            error_type=record.error_type,
            reason=record.reason,
            correlation_id=record.correlation_id,
            headers=record.headers,
        )

    def alert(self, dead_letter_id: int, exc: BaseException | None = None) -> None:
        """Tell operators; grouped by queue + kind + error type."""
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


def error_type_name(exc: BaseException) -> str:
    """``module.QualName`` of the exception, stable across messages for grouping."""
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def describe_error(exc: BaseException) -> str:
    """``last_error``: type, message and the traceback, as an operator needs to read it."""
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{error_type_name(exc)}: {exc}\n\n{trace}".rstrip()


def raw_payload(body: Any, content_type: str | None, headers: Any) -> dict[str, Any]:
    """``{"raw", "content_type", "headers"}`` for a message that is not a readable envelope.

    ``raw`` is the body as text, or base64 when it is not UTF-8; headers are kept as far
    as they are JSON-safe.
    """
    if isinstance(body, bytes | bytearray | memoryview):
        data = bytes(body)
        try:
            raw: Any = data.decode("utf-8")
            encoding = "text"
        except UnicodeDecodeError:
            raw = base64.b64encode(data).decode("ascii")
            encoding = "base64"
    elif isinstance(body, str):
        raw, encoding = body, "text"
    else:
        raw, encoding = json.dumps(body, default=repr), "text"
    return {
        "raw": raw,
        "raw_encoding": encoding,
        "content_type": content_type,
        "headers": json.loads(json.dumps(headers or {}, default=repr)),
    }


def latest_dead_letter(cursor: Any, job_id: uuid.UUID, kind: str | None) -> tuple[int, str] | None:
    """The newest dead letter of this job (id, status), if there is one."""
    cursor.execute(_LATEST, (str(job_id), kind))
    row = cursor.fetchone()
    return (int(row[0]), str(row[1])) if row else None


def pending_dead_letter(cursor: Any, job_id: uuid.UUID, kind: str | None) -> int | None:
    """The id of this job's newest dead letter unless it was replayed, else ``None``.

    A job gets one dead letter per generation: while its newest row is not ``replayed``,
    another failing copy of it is a duplicate of that row, not a second one; a replay's
    failure starts a new generation, so it is written.
    """
    latest = latest_dead_letter(cursor, job_id, kind)
    return latest[0] if latest is not None and latest[1] != "replayed" else None
