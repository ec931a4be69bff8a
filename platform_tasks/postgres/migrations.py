"""Versioned schema migrations for schema ``core``.

Migrations are numbered ``.sql`` files in package data. Applying them takes a
transaction-level advisory lock, so two processes migrating at once serialise instead of
racing, and records each version in ``core.schema_migrations`` with a checksum so an
edited, already-applied file is reported rather than silently skipped.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import psycopg2

from platform_tasks.errors import MigrationError

# Arbitrary but fixed: every platform-tasks process uses the same lock key.
ADVISORY_LOCK_KEY = 0x706C6174  # "plat"
_FILENAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_BOOKKEEPING = """
CREATE SCHEMA IF NOT EXISTS core;
CREATE TABLE IF NOT EXISTS core.schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    """Every migration shipped in the package, in version order."""
    folder = resources.files("platform_tasks") / "sql" / "migrations"
    migrations = []
    for entry in folder.iterdir():
        match = _FILENAME.match(entry.name)
        if not match:
            continue
        migrations.append(Migration(int(match[1]), match[2], entry.read_text()))
    migrations.sort(key=lambda m: m.version)
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise MigrationError(f"migration versions must be 1..n without gaps, got {versions}")
    return migrations


def migration_sql() -> str:
    """All migrations as plain SQL, for teams that apply schema changes with their own tool."""
    parts = [
        "-- platform-tasks schema migrations",
        "BEGIN;",
        f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY});",
        _BOOKKEEPING.strip(),
    ]
    for migration in load_migrations():
        parts.append(f"\n-- {migration.version:04d}_{migration.name}")
        parts.append(migration.sql.strip())
        parts.append(
            "INSERT INTO core.schema_migrations (version, name, checksum) "
            f"VALUES ({migration.version}, '{migration.name}', '{migration.checksum}') "
            "ON CONFLICT (version) DO NOTHING;"
        )
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"


def migrate(database_url: str) -> list[int]:
    """Apply pending migrations; return the versions applied by this call."""
    migrations = load_migrations()
    try:
        conn = psycopg2.connect(database_url)
    except psycopg2.OperationalError as exc:
        raise MigrationError(f"cannot connect to PLATFORM_DATABASE_URL: {exc}".strip()) from exc
    applied: list[int] = []
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
            cur.execute(_BOOKKEEPING)
            cur.execute("SELECT version, checksum FROM core.schema_migrations")
            done = dict(cur.fetchall())
            for migration in migrations:
                if migration.version in done:
                    if done[migration.version] != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{migration.name} was changed "
                            "after it was applied (checksum differs)"
                        )
                    continue
                cur.execute(migration.sql)
                cur.execute(
                    "INSERT INTO core.schema_migrations (version, name, checksum) "
                    "VALUES (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )
                applied.append(migration.version)
    finally:
        conn.close()
    return applied


def applied_versions(database_url: str) -> list[int]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass('core.schema_migrations')")
            if cur.fetchone()[0] is None:
                return []
            cur.execute("SELECT version FROM core.schema_migrations ORDER BY version")
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


def missing_migrations(conn: psycopg2.extensions.connection) -> list[Migration] | None:
    """The shipped migrations ``conn``'s database has not applied, in order; ``None`` when
    schema ``core`` was never migrated at all. Read-only: a worker checks this at start-up
    so that one upgraded before ``platform-tasks migrate`` ran stops with a clear error
    instead of failing every job on a missing table or column."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('core.schema_migrations') IS NOT NULL")
        (exists,) = cur.fetchone()
        if not exists:
            return None
        cur.execute("SELECT version FROM core.schema_migrations")
        done = {row[0] for row in cur.fetchall()}
    return [m for m in load_migrations() if m.version not in done]
