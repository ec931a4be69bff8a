"""The operations log, ``core.operations``: who ran which bulk action, on what, how far.

Every bulk replay, discard, cancel, pause and resume is one row, written before the
action starts (``outcome = 'running'``) and finished when it ends, so an action that
crashed midway is visible as a running row with its progress, and a rerun of the same
filter continues it.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import psycopg2
from psycopg2.extensions import connection as Connection
from psycopg2.extensions import cursor as Cursor
from psycopg2.extras import Json

from platform_tasks.settings import PlatformSettings

__all__ = [
    "KINDS",
    "OUTCOMES",
    "Operation",
    "connect",
    "default_actor",
    "fetch_operation",
    "finish_operation",
    "get_operation",
    "list_operations",
    "start_operation",
]

KINDS = ("replay", "discard", "cancel", "pause", "resume")
OUTCOMES = ("running", "succeeded", "partial", "failed")

_COLUMNS = (
    "id, actor, started_at, finished_at, kind, filter, matched, done, failed, outcome, "
    "last_id, max_id, detail"
)


@dataclass(frozen=True)
class Operation:
    """One row of ``core.operations``."""

    id: int
    actor: str
    started_at: datetime
    finished_at: datetime | None
    kind: str
    filter: dict[str, Any]
    matched: int
    done: int
    failed: int
    outcome: str
    last_id: int
    """The highest dead-letter id a bulk replay/discard has finished (its resume point)."""
    max_id: int | None
    """The highest dead-letter id when a bulk replay/discard started: rows that became
    dead letters after it are not its to act on."""
    detail: str | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            out[item.name] = value.isoformat() if isinstance(value, datetime) else value
        return out


def default_actor() -> str:
    """Who runs an operation when nobody says: ``PLATFORM_ACTOR``, else the OS user."""
    actor = os.environ.get("PLATFORM_ACTOR")
    if actor and actor.strip():
        return actor.strip()
    try:
        return getpass.getuser()
    except Exception:  # no user name in a bare container
        return f"uid:{os.getuid()}"


def _database_url(settings: PlatformSettings) -> str:
    if not settings.database_url:
        raise ValueError("PLATFORM_DATABASE_URL is not set (operations are logged in PostgreSQL)")
    return settings.database_url


@contextmanager
def connect(settings: PlatformSettings, conn: Connection | None = None) -> Iterator[Connection]:
    """``conn`` when given (the caller's, left open), else a new connection closed after."""
    if conn is not None:
        yield conn
        return
    own = psycopg2.connect(_database_url(settings), application_name="platform-tasks-operations")
    try:
        yield own
    finally:
        own.close()


def _operation(names: Sequence[str], values: Sequence[Any]) -> Operation:
    return Operation(**dict(zip(names, values, strict=True)))


def _fetch(cur: Cursor) -> list[Operation]:
    names = [column[0] for column in cur.description or ()]
    return [_operation(names, values) for values in cur.fetchall()]


def start_operation(
    cur: Cursor,
    *,
    kind: str,
    actor: str,
    filter: Mapping[str, Any],
    matched: int = 0,
    outcome: str = "running",
    detail: str | None = None,
) -> Operation:
    """Insert a row (the caller commits) and return it."""
    if kind not in KINDS:
        raise ValueError(f"operation kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not actor.strip():
        raise ValueError("an operation needs an actor (--actor)")
    finished = "now()" if outcome != "running" else "NULL"
    cur.execute(
        f"INSERT INTO core.operations (actor, kind, filter, matched, outcome, detail, "
        f"finished_at) VALUES (%s, %s, %s, %s, %s, %s, {finished}) RETURNING {_COLUMNS}",
        (actor, kind, Json(dict(filter)), matched, outcome, detail),
    )
    return _fetch(cur)[0]


def finish_operation(
    cur: Cursor, operation_id: int, *, outcome: str, detail: str | None = None
) -> Operation:
    """Set the outcome and ``finished_at`` of a running row (the caller commits)."""
    if outcome not in OUTCOMES or outcome == "running":
        raise ValueError(
            f"a finished operation's outcome is one of {OUTCOMES[1:]}, got {outcome!r}"
        )
    cur.execute(
        f"UPDATE core.operations SET outcome = %s, finished_at = now(), "
        f"detail = COALESCE(%s, detail) WHERE id = %s RETURNING {_COLUMNS}",
        (outcome, detail, operation_id),
    )
    rows = _fetch(cur)
    if not rows:
        raise LookupError(f"operation {operation_id} not found")
    return rows[0]


def list_operations(
    settings: PlatformSettings,
    *,
    limit: int = 50,
    kind: str | None = None,
    conn: Connection | None = None,
) -> list[Operation]:
    """The newest ``limit`` operations (of ``kind`` when given), newest first."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"operation kind must be one of {', '.join(KINDS)}, got {kind!r}")
    with connect(settings, conn) as db, db, db.cursor() as cur:
        cur.execute(
            f"SELECT {_COLUMNS} FROM core.operations "
            "WHERE (%(kind)s::text IS NULL OR kind = %(kind)s) ORDER BY id DESC LIMIT %(limit)s",
            {"kind": kind, "limit": limit},
        )
        return _fetch(cur)


def get_operation(
    settings: PlatformSettings, operation_id: int, *, conn: Connection | None = None
) -> Operation | None:
    """One operation by id, or ``None``."""
    with connect(settings, conn) as db, db, db.cursor() as cur:
        return fetch_operation(cur, operation_id)


def fetch_operation(cur: Cursor, operation_id: int, *, lock: bool = False) -> Operation | None:
    """One operation by id in the caller's transaction (``lock``: ``FOR UPDATE``)."""
    suffix = " FOR UPDATE" if lock else ""
    cur.execute(f"SELECT {_COLUMNS} FROM core.operations WHERE id = %s{suffix}", (operation_id,))
    rows = _fetch(cur)
    return rows[0] if rows else None
