"""A worker refuses to start on a PLATFORM_DATABASE_URL it cannot use, and prints no password.

Real ``celery -A tests.apps.consumer_app worker`` processes (the solo pool, without mingle
and gossip, only to keep start-up short; nothing here depends on the pool), each given a
URL with a password that must not appear anywhere in their output.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg2
import pytest

from platform_tasks.postgres.migrations import load_migrations, migrate
from platform_tasks.testing.servers import PostgresServer, free_port
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env

REPO_ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "Sup3r-s3cret-pw"


def _start_worker(redis_url: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = platform_env(redis_url=redis_url, database_url=database_url)
    argv = [
        CELERY,
        "-A",
        "tests.apps.consumer_app",
        "worker",
        "-P",
        "solo",
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        "INFO",
    ]
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


def _urls(postgres: PostgresServer) -> dict[str, str]:
    port = urlsplit(postgres.url).port
    return {
        "unknown option": f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/x?colour=blue",
        "bad port": f"postgresql://postgres:{PASSWORD}@127.0.0.1:54x32/platform",
        "bad host": f"postgresql://postgres:{PASSWORD}@[::1/platform",
        "unreachable": f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/platform",
        "no such database": f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/no_such_db",
    }


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("unknown option", 'invalid URI query parameter: "colour"'),
        ("bad port", "port '54x32'"),
        ("bad host", "IPv6 host address"),
        ("unreachable", "cannot connect before consuming"),
        ("no such database", 'database "no_such_db" does not exist'),
    ],
)
def test_worker_refuses_a_database_url_it_cannot_use(
    redis_url: str, postgres_server: PostgresServer, case: str, says: str
) -> None:
    result = _start_worker(redis_url, _urls(postgres_server)[case])
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "PLATFORM_DATABASE_URL" in output, output[-3000:]
    assert says in output, output[-3000:]
    assert "ready." not in output
    assert PASSWORD not in output
    assert "postgres:***@" in output


@pytest.fixture
def scratch_database(postgres_server: PostgresServer) -> Iterator[str]:
    """An empty database of its own, dropped afterwards."""
    name = f"startup_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(postgres_server.url)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    try:
        yield postgres_server.url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
            )
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


def test_worker_refuses_a_database_whose_schema_is_not_migrated(
    redis_url: str, scratch_database: str
) -> None:
    """A worker upgraded before ``platform-tasks migrate`` ran would fail every job on a
    missing table; it stops at start-up instead, naming the command to run."""
    result = _start_worker(redis_url, scratch_database)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "PLATFORM_DATABASE_URL" in output and "platform-tasks migrate" in output, output[-3000:]
    assert "schema core is not migrated" in output, output[-3000:]
    assert "ready." not in output


def test_worker_refuses_a_schema_missing_the_newest_migration(
    redis_url: str, scratch_database: str, tmp_path: Path
) -> None:
    migrate(scratch_database)
    newest = load_migrations()[-1]
    conn = psycopg2.connect(scratch_database)
    with conn, conn.cursor() as cur:
        cur.execute("DELETE FROM core.schema_migrations WHERE version = %s", (newest.version,))
    conn.close()
    result = _start_worker(redis_url, scratch_database)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert f"{newest.version:04d}_{newest.name}" in output, output[-3000:]
    assert "platform-tasks migrate" in output and "ready." not in output, output[-3000:]

    migrate(scratch_database)  # applied: the same worker starts
    assert "ready." in _start_worker_until_ready(redis_url, scratch_database, tmp_path)


def _start_worker_until_ready(redis_url: str, database_url: str, tmp_path: Path) -> str:
    env = platform_env(redis_url=redis_url, database_url=database_url)
    argv = [
        CELERY,
        "-A",
        "tests.apps.consumer_app",
        "worker",
        "-P",
        "solo",
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        "INFO",
    ]
    with celery_processes() as started:
        proc = CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / "w.log").start()
        started.append(proc)
        proc.wait_for_log("ready.", timeout=120)
        return proc.log()
