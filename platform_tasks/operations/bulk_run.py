"""One bulk operation's run: its ``core.operations`` row, claimed by one process at a time.

A bulk replay or discard claims its operation row under a PostgreSQL advisory lock, so a
rerun of the same kind and filter continues an unfinished run instead of starting a second
one beside it, and finishes the row with its outcome whatever happened. The walk over the
rows is :mod:`platform_tasks.operations.bulk`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from psycopg2.extensions import connection as Connection
from psycopg2.extensions import cursor as Cursor
from psycopg2.extras import Json

from platform_tasks.dead_letters.batch import (
    Group,
)
from platform_tasks.operations.filters import OperationFilter
from platform_tasks.operations.log import (
    Operation,
    connect,
    default_actor,
    fetch_operation,
    finish_operation,
    start_operation,
)
from platform_tasks.postgres.queries import load_queries
from platform_tasks.settings import PlatformSettings

logger = logging.getLogger("platform_tasks.operations.bulk")

LOCK_CLASS = 0x6F707320  # "ops ": advisory locks (class, operation id) of running operations


def operation_queries() -> dict[str, str]:
    return load_queries("operations")


@dataclass
class BulkRun:
    """One run of an operation on one connection: where it is and what it did."""

    operation: Operation
    where: OperationFilter
    resumed: bool
    after_id: int
    max_id: int
    refused: list[tuple[int, str]] = field(default_factory=list)
    groups: set[Group] = field(default_factory=set)
    skipped: list[int] = field(default_factory=list)
    """Matching rows another transaction held when their batch was locked (``SKIP
    LOCKED``): revisited, waiting for their holder, once the walk is done."""


def check_filter(
    where: OperationFilter, batch_size: int, allow_empty_filter: bool, operation_id: int | None
) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if operation_id is None and where.is_empty and not allow_empty_filter:
        raise ValueError(
            "an empty filter means every pending dead letter: give a filter (queue, kind, "
            "tenant_id, error_type, since, until) or allow_empty_filter=True (--all)"
        )


def _try_lock(cur: Cursor, operation_id: int) -> bool:
    cur.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, operation_id % 2**31))
    row = cur.fetchone()
    return bool(row and row[0])


def _unlock(db: Connection, operation_id: int) -> None:
    if db.closed:
        return
    try:
        with db, db.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, operation_id % 2**31))
    except Exception:  # the session ends soon; its locks end with it
        logger.warning(
            "could not release the lock of operation %s",
            operation_id,
            exc_info=True,
            extra={"event": "operations.unlock_failed", "operation_id": operation_id},
        )


def _claim(
    db: Connection, kind: str, where: OperationFilter, actor: str, operation_id: int | None
) -> BulkRun:
    """Continue an unfinished operation of this kind and filter whose process is gone, or
    start a new one; either way hold its advisory lock for this session."""
    queries = operation_queries()
    with db, db.cursor() as cur:
        if operation_id is not None:
            found = fetch_operation(cur, operation_id)
            if found is None:
                raise ValueError(f"operation {operation_id} not found")
            if found.kind != kind or found.outcome != "running":
                raise ValueError(
                    f"operation {operation_id} is a {found.kind} operation that is "
                    f"{found.outcome}; only a running {kind} operation can be continued"
                )
            stored = OperationFilter.from_json(found.filter)
            if not where.is_empty and where != stored:
                raise ValueError(
                    f"operation {operation_id} has filter {stored.describe()}, "
                    f"not {where.describe()}"
                )
            if not _try_lock(cur, found.id):
                raise ValueError(f"operation {operation_id} is being run by another process")
            return BulkRun(found, stored, True, found.last_id, found.max_id or 0)
        cur.execute(queries["unfinished"], {"kind": kind, "filter": Json(where.to_json())})
        for (candidate,) in cur.fetchall():
            if _try_lock(cur, int(candidate)):
                found = fetch_operation(cur, int(candidate))
                if found is None or found.outcome != "running":  # finished meanwhile
                    _release_in(cur, int(candidate))
                    continue
                return BulkRun(found, where, True, found.last_id, found.max_id or 0)
        cur.execute(queries["count_matching"], where.params())
        row = cur.fetchone()
        matched, max_id = (int(row[0]), int(row[1] or 0)) if row else (0, 0)
        operation = start_operation(
            cur, kind=kind, actor=actor, filter=where.to_json(), matched=matched
        )
        cur.execute("UPDATE core.operations SET max_id = %s WHERE id = %s", (max_id, operation.id))
        _try_lock(cur, operation.id)
        return BulkRun(operation, where, False, 0, max_id)


def _release_in(cur: Cursor, operation_id: int) -> None:
    cur.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, operation_id % 2**31))


@contextmanager
def operation_run(
    settings: PlatformSettings,
    conn: Connection | None,
    kind: str,
    where: OperationFilter,
    actor: str | None,
    operation_id: int | None,
) -> Iterator[tuple[Connection, BulkRun]]:
    with connect(settings, conn) as db:
        run = _claim(db, kind, where, actor or default_actor(), operation_id)
        _log_start(run, kind)
        try:
            yield db, run
        except BaseException as exc:
            if not db.closed:
                db.rollback()
                try:
                    detail = f"{type(exc).__name__}: {exc}"
                    with db, db.cursor() as cur:
                        run.operation = finish_operation(
                            cur, run.operation.id, outcome="failed", detail=detail
                        )
                except Exception:
                    logger.warning(
                        "could not record the failure of operation %s",
                        run.operation.id,
                        exc_info=True,
                        extra={
                            "event": "operations.finish_failed",
                            "operation_id": run.operation.id,
                        },
                    )
            raise
        finally:
            _unlock(db, run.operation.id)


def finish_run(db: Connection, run: BulkRun) -> Operation:
    with db, db.cursor() as cur:
        current = fetch_operation(cur, run.operation.id, lock=True)
        assert current is not None
        outcome = "succeeded" if current.failed == 0 else "partial"
        operation = finish_operation(cur, current.id, outcome=outcome)
    logger.info(
        "operation %s (%s) %s: %d done, %d failed of %d matched",
        operation.id,
        operation.kind,
        operation.outcome,
        operation.done,
        operation.failed,
        operation.matched,
        extra={
            "event": "operations.finished",
            "operation_id": operation.id,
            "kind": operation.kind,
            "outcome": operation.outcome,
            "done": operation.done,
            "failed": operation.failed,
            "matched": operation.matched,
        },
    )
    return operation


def _log_start(run: BulkRun, kind: str) -> None:
    logger.info(
        "operation %s (%s) %s by %s on %s",
        run.operation.id,
        kind,
        "continued" if run.resumed else "started",
        run.operation.actor,
        run.where.describe(),
        extra={
            "event": "operations.started",
            "operation_id": run.operation.id,
            "kind": kind,
            "resumed": run.resumed,
            "actor": run.operation.actor,
            "filter": run.where.to_json(),
        },
    )
