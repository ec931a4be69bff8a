"""The harness starts real servers (PostgreSQL as an unprivileged user when we are root)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psycopg2
import pytest
import redis

from platform_tasks.errors import ServerStartError
from platform_tasks.testing.servers import PostgresServer, RedisServer, find_postgres_bin


def test_postgres_runs_unprivileged_and_survives_restart(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory.postgres()
    conn = psycopg2.connect(server.url)
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE kept (n int)")
        cur.execute("INSERT INTO kept VALUES (42)")
        cur.execute("SELECT usesuper FROM pg_user WHERE usename = current_user")
        assert cur.fetchone() == (True,)
    conn.close()
    owner = Path(server.data_dir).stat().st_uid
    if os.geteuid() == 0:
        assert owner != 0, "the cluster must not be owned by root"
    server.restart(mode="immediate")
    conn = psycopg2.connect(server.url)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT n FROM kept")
        assert cur.fetchone() == (42,)
    conn.close()
    server.stop()
    assert not server.running
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(server.url, connect_timeout=2)


def test_redis_restart_keeps_data_with_appendfsync_always(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory.redis(appendfsync="always")
    client = redis.Redis.from_url(server.url)
    client.set("kept", "yes")
    client.close()
    server.restart(kill=True)
    client = redis.Redis.from_url(server.url)
    assert client.get("kept") == b"yes"
    client.close()
    server.stop()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server.url, socket_connect_timeout=1).ping()


def test_redis_start_failure_is_reported_with_the_log(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r", extra_args=["--no-such-option", "1"])
    with pytest.raises(ServerStartError, match="redis-server exited"):
        server.start(timeout=10)


def test_postgres_binaries_are_found() -> None:
    directory = find_postgres_bin()
    assert (directory / "postgres").exists() and (directory / "initdb").exists()


def test_postgres_from_the_bundled_wheel_when_path_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin/nonexistent")
    monkeypatch.setattr(Path, "glob", lambda self, pattern: iter(()))
    directory = find_postgres_bin()
    assert "pgserver" in str(directory)
    os.chmod(tmp_path, 0o755)
    server = PostgresServer(tmp_path / "pg" / "data").start()
    try:
        conn = psycopg2.connect(server.url)
        with conn, conn.cursor() as cur:
            cur.execute("SHOW server_version")
            assert cur.fetchone()[0]
        conn.close()
    finally:
        server.close()


def test_close_deletes_a_private_cluster_folder_and_keeps_a_requested_one(tmp_path: Path) -> None:
    """As root, a cluster whose requested folder ``nobody`` cannot reach lives in a private
    temporary folder: ``close`` deletes it (each suite run left one behind, hundreds of
    megabytes each). A requested folder it could use stays, for the caller to keep."""
    if os.geteuid() != 0:
        pytest.fail("the private folder exists only when the harness runs as root (as here)")
    private_parent = tmp_path / "private"
    private_parent.mkdir(mode=0o700)
    with PostgresServer(private_parent / "pg" / "data") as server:
        private = server.data_dir
        assert not private.is_relative_to(private_parent) and (private / "PG_VERSION").exists()
    assert not private.parent.exists()

    shared = Path(tempfile.mkdtemp(prefix="platform-tests-"))  # reachable by nobody
    try:
        os.chmod(shared, 0o755)
        requested = shared / "pg" / "data"
        server = PostgresServer(requested).start()
        server.close()
        assert server.data_dir == requested.resolve() and (requested / "PG_VERSION").exists()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
