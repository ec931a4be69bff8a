"""One PostgreSQL connection per worker process, reopened after failures and forks.

A consumer does one short transaction per job, so a single long-lived connection per
process is the cheapest thing that works: no pool, no connect per job. A connection is
never shared across ``fork`` (the prefork pool forks after the app is imported), and one
that failed is thrown away rather than trusted again.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import psycopg2
from psycopg2.extensions import connection as Connection

from platform_tasks.errors import ConfigurationError
from platform_tasks.postgres.migrations import missing_migrations
from platform_tasks.settings import PlatformSettings, redact_url, variable_name, without_secrets

logger = logging.getLogger(__name__)

UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    psycopg2.OperationalError,
    psycopg2.InterfaceError,
)
"""Errors that mean "the database is unreachable", not "this job is wrong"."""


class DatabaseUnavailable(Exception):
    """The database could not be reached; the job must wait, not fail.

    Internal control flow: never raised to a handler and never dead-lettered.
    """


STARTUP_CONNECT_TIMEOUT_SECONDS = 5
_MIGRATE_HINT = (
    "run `platform-tasks migrate` (or apply `platform-tasks migrate --sql`) before workers start"
)
_verified_urls: set[str] = set()


def require_database_url(
    settings: PlatformSettings, *, connect_timeout: int = STARTUP_CONNECT_TIMEOUT_SECONDS
) -> str:
    """The database URL, once a test connection to it succeeded; else a start-up error.

    The worker calls this before it consumes, so a database that is unset, refuses the
    URL (no such database, authentication failed) or cannot be reached within
    ``connect_timeout`` seconds, or whose schema ``core`` lacks a migration this version
    ships, stops the worker with an error naming ``PLATFORM_DATABASE_URL`` (password
    masked) and, for the schema, ``platform-tasks migrate``, instead of every job failing
    or waiting.
    An unreachable database at start-up is fatal: a supervisor (compose ``restart``,
    systemd, Kubernetes) restarts the worker, and an outage after start-up is waited out
    by the consumer as before. A URL is tested once per process (and its forks), so
    later callers on the job path pay nothing and never turn an outage into this error.
    """
    var = variable_name("database_url")
    url = settings.database_url
    if not url:
        raise ConfigurationError(
            f"{var} is not set: PlatformTask consumers keep their "
            "idempotency rows and dead letters in PostgreSQL (e.g. "
            "PLATFORM_DATABASE_URL=postgresql://user:pass@host:5432/db)"
        )
    if url in _verified_urls:
        return url
    try:
        conn = psycopg2.connect(
            url, connect_timeout=connect_timeout, application_name="platform-tasks start-up check"
        )
    except psycopg2.Error as exc:
        reason = without_secrets(str(exc).strip(), url)
        raise ConfigurationError(
            f"{var} ({redact_url(url)}): cannot connect before consuming: {reason}"
        ) from None
    try:
        missing = missing_migrations(conn)
    except psycopg2.Error as exc:
        reason = without_secrets(str(exc).strip(), url)
        raise ConfigurationError(
            f"{var} ({redact_url(url)}): cannot read schema core's migrations: {reason}"
        ) from None
    finally:
        conn.close()
    if missing is None:
        raise ConfigurationError(
            f"{var} ({redact_url(url)}): schema core is not migrated: " + _MIGRATE_HINT
        )
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
        raise ConfigurationError(
            f"{var} ({redact_url(url)}): schema core lacks migration(s) {names}: " + _MIGRATE_HINT
        )
    _verified_urls.add(url)
    return url


class Database:
    """Hands out this thread's connection, opening a fresh one when needed.

    One connection per process and thread: the prefork pool gets one per child, and the
    ``threads`` pool one per thread, since a psycopg2 connection holds one transaction.

    ``autocommit=True`` hands out connections on which psycopg2 sends no ``BEGIN`` of its
    own: the caller opens and ends transactions with statements, which lets ``BEGIN``
    travel in the same round trip as the first statement (see :func:`begin`).
    """

    def __init__(self, url: str, *, connect_timeout: int = 5, autocommit: bool = False) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self.autocommit = autocommit
        self._local = threading.local()

    def connection(self) -> Connection:
        """The open connection; raises :class:`DatabaseUnavailable` when the server is down."""
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None and (self._local.pid != os.getpid() or conn.closed):
            self.discard()
            conn = None
        if conn is None:
            conn = self._open()
        return conn

    def _open(self) -> Connection:
        try:
            conn: Connection = psycopg2.connect(
                self.url,
                connect_timeout=self.connect_timeout,
                application_name="platform-tasks-consumer",
            )
        except UNAVAILABLE_ERRORS as exc:
            raise DatabaseUnavailable(str(exc).strip()) from exc
        conn.autocommit = self.autocommit
        self._local.conn = conn
        self._local.pid = os.getpid()
        return conn

    def discard(self) -> None:
        """Throw this thread's connection away after an error; the next call reconnects.

        A connection inherited over ``fork`` is dropped without closing it: closing would
        end the parent's session.
        """
        conn = getattr(self._local, "conn", None)
        same_process = getattr(self._local, "pid", None) == os.getpid()
        self._local.conn = None
        self._local.pid = None
        if conn is not None and same_process:
            try:
                conn.close()
            except Exception:  # already broken; closing is best effort
                logger.debug(
                    "closing a broken connection failed",
                    exc_info=True,
                    extra={"event": "db.close_failed"},
                )

    def reachable(self) -> bool:
        """Whether a trivial query succeeds now (used while waiting for the database)."""
        try:
            conn = self.connection()
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
            conn.rollback()
            return True
        except (DatabaseUnavailable, psycopg2.OperationalError, psycopg2.InterfaceError):
            self.discard()
            return False

    def close(self) -> None:
        self.discard()


def is_unavailable(exc: BaseException, conn: Any | None = None) -> bool:
    """Whether ``exc`` means the database went away (rather than a bad statement).

    ``OperationalError`` covers both a lost server and e.g. a statement timeout; a closed
    connection tells them apart when we have it.
    """
    if isinstance(exc, DatabaseUnavailable | psycopg2.InterfaceError):
        return True
    if isinstance(exc, psycopg2.OperationalError):
        if conn is None:
            return True
        return bool(getattr(conn, "closed", 0)) or _connection_broken(conn)
    return False


def begin(cursor: Any, sql: str, params: Any = None) -> None:
    """Open a transaction and run its first statement in one round trip.

    For a connection in autocommit mode (psycopg2 would otherwise send ``BEGIN`` on its
    own round trip first). The statement's result is the cursor's.
    """
    cursor.execute("BEGIN; " + sql, params)


def commit(cursor: Any) -> None:
    """End the transaction :func:`begin` opened, keeping its writes."""
    cursor.execute("COMMIT")


def rollback(cursor: Any) -> None:
    """End the transaction :func:`begin` opened, undoing its writes (harmless without one)."""
    cursor.execute("ROLLBACK")


def _connection_broken(conn: Any) -> bool:
    try:
        conn.rollback()
        with conn.cursor() as cur:
            if conn.autocommit:  # psycopg2 leaves transactions it did not open to us
                cur.execute("ROLLBACK")
            cur.execute("SELECT 1")
        conn.rollback()
        return False
    except Exception:
        return True
