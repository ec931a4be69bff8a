"""Dead-letter records: what a row says about a failure, and whether the job has one already.

:class:`~platform_tasks.dead_letters.dead_letter.DeadLetter` is the row; this module
fills its fields when a consumer gives up on a job: the error as type, message and
traceback, and the raw form of a message that was not a readable envelope. It also finds
a job's newest row, so a job is dead-lettered once per generation.
"""

from __future__ import annotations

import base64
import json
import traceback
import uuid
from typing import Any

# FOR SHARE waits for a replay that holds the row (it publishes, then commits the row
# as replayed): without it a fast consumer of the replayed message could read the row
# still pending and drop the replay as "already dead-lettered".
_LATEST = (
    "SELECT id, status FROM core.dead_letters WHERE job_id = %s AND kind IS NOT DISTINCT FROM %s "
    "ORDER BY id DESC LIMIT 1 FOR SHARE"
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
