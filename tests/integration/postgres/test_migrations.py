"""Migrations: idempotent, safe when run concurrently, printable as SQL."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import psycopg2

from platform_tasks.postgres.migrations import (
    applied_versions,
    load_migrations,
    migrate,
    migration_sql,
)


def _tables(url: str) -> set[str]:
    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'core'")
        names = {row[0] for row in cur.fetchall()}
    conn.close()
    return names


def test_migrate_twice_then_concurrently(server_factory) -> None:  # type: ignore[no-untyped-def]
    url = server_factory.postgres().url
    expected = [m.version for m in load_migrations()]
    assert migrate(url) == expected
    assert migrate(url) == []
    assert {"processed_jobs", "dead_letters", "schema_migrations"} <= _tables(url)

    fresh = server_factory.postgres().url
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(migrate, [fresh] * 4))
    applied = sorted(v for result in results for v in result)
    assert applied == expected, "each migration applied exactly once across racers"
    assert applied_versions(fresh) == expected


def test_two_processes_migrate_at_once(server_factory) -> None:  # type: ignore[no-untyped-def]
    url = server_factory.postgres().url
    env = {"PLATFORM_DATABASE_URL": url, "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "platform_tasks.cli", "migrate"]
    procs = [
        subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    texts = sorted(out.decode() for out, _ in outputs)
    assert texts[0].startswith("applied migrations") or texts[1].startswith("applied migrations")
    assert any("up to date" in t for t in texts)


def test_sql_output_applies_cleanly_with_psql_semantics(server_factory) -> None:  # type: ignore[no-untyped-def]
    url = server_factory.postgres().url
    sql = migration_sql()
    assert "CREATE TABLE IF NOT EXISTS core.processed_jobs" in sql
    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql)
        cur.execute(sql)
    conn.close()
    assert migrate(url) == [], "the printed SQL records versions, so migrate sees them applied"


def test_cli_prints_sql() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "platform_tasks.cli", "migrate", "--sql"],
        capture_output=True,
        check=True,
        text=True,
    )
    assert out.stdout == migration_sql()


def test_cli_names_the_missing_variable() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "platform_tasks.cli", "migrate"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2
    assert "PLATFORM_DATABASE_URL" in out.stderr


def test_indexes_for_cli_queries_exist(database_url: str) -> None:
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = 'core'")
        defs = " ".join(row[0] for row in cur.fetchall())
    conn.close()
    for column in ("status", "queue", "tenant_id", "created_at", "processed_at"):
        assert f"({column}" in defs, column
