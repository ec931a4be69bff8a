"""Recorded output: the small JSON value a handler returned, kept with its claim.

The value is written to the job's own ``core.processed_jobs`` row (column ``output``,
migration 0011) in the job's transaction, just before it commits: it exists if and only
if the job's work committed, and it lives as long as the row
(``PLATFORM_PROCESSED_JOBS_TTL_DAYS``). A handler returning ``None`` (most do) costs no
statement at all.

A value that is not JSON, or whose JSON is larger than ``PLATFORM_JOB_OUTPUT_MAX_BYTES``,
raises :class:`~platform_tasks.errors.OutputRefused` inside the job's attempt: a
permanent error, so the job is dead-lettered at once with an error naming the size and
the setting, and its work is rolled back with it. Dropping it silently would apply the
job without the output a batch callback or an operator relies on; retrying cannot help,
as the same handler returns the same value. The dead letter can be replayed once the
handler (or the setting) changed.

:func:`read_outputs` reads the outputs of many jobs in one query, for batch callbacks and
``jobs show``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from platform_tasks.errors import OutputRefused
from platform_tasks.postgres.queries import load_queries

__all__ = ["encode_output", "read_outputs", "record_output"]

_QUERIES = load_queries("job_status")


def encode_output(value: Any, max_bytes: int) -> str:
    """``value`` as compact JSON text; :class:`OutputRefused` when not JSON or too large."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OutputRefused(
            f"the handler returned a {type(value).__name__} that is not JSON ({exc}); a "
            "PlatformTask's return value is recorded as the job's output: return a JSON "
            "value (dict, list, str, number, bool) or None"
        ) from None
    size = len(text.encode())
    if size > max_bytes:
        raise OutputRefused(
            f"the handler returned {size} bytes of output, more than "
            f"PLATFORM_JOB_OUTPUT_MAX_BYTES={max_bytes}; return a small summary (ids, "
            "counts) and keep large results in your own tables"
        )
    return text


def record_output(cursor: Any, job_id: str, consumer: str, value: Any, *, max_bytes: int) -> None:
    """Store ``value`` on the job's claimed row, in the cursor's (the job's) transaction.
    ``None`` stores nothing; with ``max_bytes`` 0 nothing is ever stored."""
    if value is None or max_bytes == 0:
        return
    text = encode_output(value, max_bytes)
    cursor.execute(
        _QUERIES["record_output"], {"job_id": job_id, "consumer": consumer, "output": text}
    )


def read_outputs(cursor: Any, job_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The recorded outputs of ``job_ids``: ``{job_id: {consumer: output}}``, only for the
    jobs applied with one (a job with no row, or whose handler returned ``None``, is
    absent). One indexed query however many ids."""
    ids = sorted({str(job_id) for job_id in job_ids})
    if not ids:
        return {}
    cursor.execute(_QUERIES["read_outputs"], {"job_ids": ids})
    found: dict[str, dict[str, Any]] = {}
    for job_id, consumer, output in cursor.fetchall():
        found.setdefault(str(job_id), {})[consumer] = output  # jsonb: decoded by psycopg2
    return found
