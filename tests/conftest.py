"""Session-wide real servers for the whole suite.

One Redis and one PostgreSQL serve every test; each test starts from an empty Redis
database and empty platform tables. RabbitMQ starts only when a test asks for it (its
start-up costs many seconds of CPU), once per session; each RabbitMQ test gets a fresh
empty virtual host instead of a restarted server. Fault tests that stop or kill a server get their
own servers from ``server_factory`` so they never disturb the shared ones.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import redis

from platform_tasks.harness import PostgresServer, RabbitMQServer, RedisServer
from platform_tasks.settings import PlatformSettings

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def servers_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="platform-tests-"))
    os.chmod(base, 0o755)
    yield base


@pytest.fixture(scope="session")
def redis_server(servers_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(servers_dir / "redis", appendfsync="always").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def rabbitmq_server(servers_dir: Path) -> Iterator[RabbitMQServer]:
    """One RabbitMQ node for the session; a missing package fails the test, never skips."""
    server = RabbitMQServer(servers_dir / "rabbitmq").start()
    yield server
    server.close()


_vhosts: list[str] = []


@pytest.fixture
def rabbitmq_url(rabbitmq_server: RabbitMQServer, request: pytest.FixtureRequest) -> str:
    """URL of a new empty virtual host on the shared RabbitMQ (the previous one is deleted).

    A test that stopped the shared node gets it started again here, so one fault test
    never breaks the next.
    """
    if not rabbitmq_server.running:
        rabbitmq_server.start()
    label = "".join(c if c.isalnum() or c in "-_" else "_" for c in request.node.name[:40])
    name = f"t{len(_vhosts)}-{label}"
    url = rabbitmq_server.fresh_vhost(name, drop=_vhosts[-1:])
    _vhosts.append(name)
    return url


@pytest.fixture(scope="session")
def postgres_server(servers_dir: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(servers_dir / "postgres" / "data").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def migrated_database(postgres_server: PostgresServer) -> str:
    from platform_tasks.migrations import migrate

    migrate(postgres_server.url)
    return postgres_server.url


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """URL of the shared Redis, flushed before the test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def database_url(migrated_database: str) -> str:
    """URL of the shared database with the platform tables emptied."""
    conn = psycopg2.connect(migrated_database)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "SELECT string_agg(format('%I.%I', schemaname, tablename), ', ') "
                "FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema') "
                "AND tablename <> 'schema_migrations'"
            )
            (tables,) = cur.fetchone()
            if tables:
                cur.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    finally:
        conn.close()
    return migrated_database


@pytest.fixture
def settings(redis_url: str, database_url: str) -> PlatformSettings:
    return PlatformSettings.build(
        redis_url=redis_url,
        database_url=database_url,
        profile="test",
        delay_poll_interval_seconds=0.1,
    )


class ServerFactory:
    """Creates private servers for fault tests and stops them all at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: list[RedisServer | PostgresServer] = []

    def redis(self, **kwargs: object) -> RedisServer:
        server = RedisServer(self.base / f"redis-{len(self.started)}", **kwargs)  # type: ignore[arg-type]
        self.started.append(server.start())
        return server

    def postgres(self) -> PostgresServer:
        server = PostgresServer(self.base / f"pg-{len(self.started)}" / "data")
        self.started.append(server.start())
        return server

    def stop_all(self) -> None:
        for server in reversed(self.started):
            server.stop()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    os.chmod(tmp_path, 0o755)
    factory = ServerFactory(tmp_path)
    yield factory
    factory.stop_all()
