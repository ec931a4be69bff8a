"""The SQL calls of batches, each in the caller's transaction (a psycopg2 cursor).

The queries are named in ``platform_tasks/sql/batches.sql``; this module only binds their
parameters and reads their rows, so the counting rules live in one place, as SQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg2.errors
from psycopg2.extras import Json

from platform_tasks.postgres.queries import load_queries

__all__ = [
    "LOCK_CLASS",
    "OUTCOMES",
    "SHARD_EMPTIED",
    "ChildRow",
    "Completion",
    "add_jobs",
    "counts",
    "create_batch",
    "end_applied_and_commit",
    "end_job",
    "mark_complete",
    "mark_death",
    "remaining_after_lock",
    "shards_of",
    "sql",
]

LOCK_CLASS = 0x62617463  # "batc": advisory locks (class, hashtext(batch id)) of batches
"""The advisory lock class a shard-zero transaction takes for its batch."""

OUTCOMES = ("applied", "dead_lettered", "discarded", "cancelled")
"""How a child can end (the CHECK of ``core.batch_jobs.outcome``)."""


def sql(name: str) -> str:
    """The named query of ``platform_tasks/sql/batches.sql``."""
    return load_queries("batches")[name]


@dataclass(frozen=True)
class ChildRow:
    """A child joining a batch: its job id and what ``batches show`` groups it by."""

    job_id: uuid.UUID
    queue: str
    kind: str
    tenant_id: str


def create_batch(
    cur: Any,
    batch_id: uuid.UUID,
    *,
    profile: str,
    description: str,
    shards: int,
    callbacks: Mapping[str, Mapping[str, Any] | None],
) -> None:
    """Insert the batch's row (its callbacks as jsonb specs, ``None`` for none)."""
    cur.execute(
        sql("create_batch"),
        {
            "batch": str(batch_id),
            "profile": profile,
            "description": description,
            "shards": shards,
            **{
                name: None if spec is None else Json(dict(spec)) for name, spec in callbacks.items()
            },
        },
    )


def shards_of(cur: Any, batch_id: uuid.UUID) -> int | None:
    """The batch's shard count, ``None`` when there is no such batch."""
    cur.execute(sql("batch_of_job"), {"batch": str(batch_id)})
    row = cur.fetchone()
    return None if row is None else int(row[1])


def add_jobs(cur: Any, batch_id: uuid.UUID, children: Sequence[ChildRow]) -> None:
    """Children join the batch (one statement for all of them)."""
    if not children:
        return
    cur.execute(
        sql("add_jobs"),
        {
            "batch": str(batch_id),
            "jobs": [str(child.job_id) for child in children],
            "queues": [child.queue for child in children],
            "kinds": [child.kind for child in children],
            "tenants": [child.tenant_id for child in children],
        },
    )


_PREPARED_NAME = "platform_batch_end_by_key"
_prepared: set[tuple[int, int]] = set()
"""``(id(connection), backend pid)`` of the sessions :data:`_PREPARED_NAME` was prepared
in: a psycopg2 connection takes no attribute and no weak reference, and the pair tells
a reconnected session apart."""


SHARD_EMPTIED = "PTB01"
"""The SQLSTATE of the ending sent with the COMMIT when it brought a shard to zero
(migration 0012): nothing was committed; count it again with :func:`end_job`."""
_SAVEPOINT = "platform_batch_ending"


def _prepared_end_job() -> str:
    """``end_job`` as the body of a ``PREPARE`` (``$1`` job, ``$2`` outcome, ``$3`` batch,
    ``$4`` before_commit), its ``%%`` kept: it is sent with the ``EXECUTE``'s parameters."""
    text = sql("end_job")
    for name, number in (("job", 1), ("outcome", 2), ("batch", 3), ("before_commit", 4)):
        text = text.replace(f"%({name})s", f"${number}")
    return f"PREPARE {_PREPARED_NAME} (uuid, text, uuid, boolean) AS {text}"


def end_job(
    cur: Any, job_id: uuid.UUID | str, outcome: str, batch_id: uuid.UUID | str | None = None
) -> list[tuple[uuid.UUID, int]]:
    """Count the child's ending once: ``(batch id, its shard's remaining)`` per batch it
    was counted in; empty when it is no child or had ended already. Each count also moves
    the batch's ``progressed_at`` (at most once a second).

    With ``batch_id`` (the batch its message named: every ending the consumer counts)
    one round trip; without, the job's batches are looked up first (a cancel, a dead
    letter without the header), then counted one by one.

    It runs once per child, so it is a prepared statement of the session, which finds
    the child by primary key and runs one generic plan (planning the statement took
    longer than running it): prepared in the round trip of its first execution (a
    ``PREPARE`` outlives a rollback), prepared again after the session lost it (its error
    ends this transaction; the delivery starts over)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
    if batch_id is not None:
        batches = [str(batch_id)]
    else:
        cur.execute(sql("batches_of_job"), {"job": str(job_id)})
        batches = [str(batch) for (batch,) in cur.fetchall()]
    counted = []
    for batch in batches:
        counted += [
            (uuid.UUID(str(row[0])), int(row[1]))
            for row in _execute_end_job(cur, str(job_id), outcome, batch)
        ]
    return counted


def _execute_end_job(cur: Any, job_id: str, outcome: str, batch_id: str) -> list[tuple[Any, ...]]:
    _execute_prepared(cur, "{execute}", (job_id, outcome, batch_id, False))
    return list(cur.fetchall())


def end_applied_and_commit(cur: Any, job_id: uuid.UUID | str, batch_id: uuid.UUID | str) -> bool:
    """Count the child's ``applied`` ending and commit its transaction, in one round trip
    (a savepoint, the ending, the ``COMMIT``): ``True`` when that committed, counted or not
    (ended already). ``False`` when the ending brought a shard to zero: nothing was
    counted nor committed, the transaction is open again at the savepoint, the handler's
    work in it; count with :func:`end_job` (which may complete the batch) and commit.

    Whether the ``COMMIT`` itself committed is the caller's to check
    (``cur.statusmessage``), as after any ``COMMIT``."""
    params = (str(job_id), "applied", str(batch_id), True)
    try:
        _execute_prepared(cur, f"SAVEPOINT {_SAVEPOINT}; {{execute}}; COMMIT", params)
    except psycopg2.Error as exc:
        if exc.pgcode != SHARD_EMPTIED:
            raise
        cur.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        return False
    return True


def _execute_prepared(cur: Any, template: str, params: tuple[Any, ...]) -> None:
    """Run ``template`` with ``{execute}`` the ``EXECUTE`` of the ending, preparing it in
    the same round trip the first time in the session."""
    session = (id(cur.connection), cur.connection.get_backend_pid())
    execute = template.format(execute=f"EXECUTE {_PREPARED_NAME} (%s, %s, %s, %s)")
    try:
        if session in _prepared:
            cur.execute(execute, params)
        else:
            cur.execute(f"{_prepared_end_job()}; {execute}", params)
            _prepared.add(session)
    except psycopg2.errors.InvalidSqlStatementName:
        _prepared.discard(session)
        raise
    except psycopg2.errors.DuplicatePreparedStatement:
        _prepared.add(session)  # prepared by an earlier try whose transaction failed
        raise
    except psycopg2.Error as exc:
        if exc.pgcode == SHARD_EMPTIED:
            _prepared.add(session)  # it ran, so it was prepared
        raise


def remaining_after_lock(cur: Any, batch_id: uuid.UUID) -> int:
    """Lock the batch (row, then advisory lock) and read how many children are left."""
    params = {"batch": str(batch_id), "lock_class": LOCK_CLASS}
    cur.execute(sql("lock_batch"), params)
    cur.execute(sql("remaining"), params)
    row = cur.fetchone()
    return int(row[0]) if row else 0


def counts(cur: Any, batch_id: uuid.UUID) -> dict[str, int]:
    """``{outcome: n, ..., "total": n}`` of the batch's children (every outcome listed)."""
    cur.execute(sql("counts"), {"batch": str(batch_id)})
    found = {outcome: int(n) for outcome, n in cur.fetchall()}
    result = {outcome: found.get(outcome, 0) for outcome in OUTCOMES}
    result["total"] = sum(found.values())
    return result


@dataclass(frozen=True)
class Completion:
    """The callbacks the completing transaction fires (``None``: not this time)."""

    on_complete: Mapping[str, Any] | None
    on_success: Mapping[str, Any] | None
    created_at: datetime


def mark_complete(cur: Any, batch_id: uuid.UUID, *, clean: bool) -> Completion | None:
    """Record the batch complete (and successful when ``clean``); what fires now."""
    cur.execute(sql("mark_complete"), {"batch": str(batch_id), "clean": clean})
    row = cur.fetchone()
    return None if row is None else Completion(row[0], row[1], row[2])


def mark_death(cur: Any, batch_id: uuid.UUID) -> tuple[Mapping[str, Any] | None, datetime] | None:
    """Record the batch's first dead letter: ``(on_death, created_at)`` the first time."""
    cur.execute(sql("mark_death"), {"batch": str(batch_id)})
    row = cur.fetchone()
    return None if row is None else (row[0], row[1])
