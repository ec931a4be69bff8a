"""Session-wide real servers for the whole suite, and how it is split between processes.

One Redis and one PostgreSQL serve every test of a pytest session (of an xdist worker:
see :func:`pytest_collection_modifyitems`); each test starts from an empty Redis
database and empty platform tables. RabbitMQ starts only when a test asks for it (its
start-up costs many seconds of CPU), once per session; each RabbitMQ test gets a fresh
empty virtual host instead of a restarted server. Fault tests that stop or kill a server
get their own servers from ``server_factory`` so they never disturb the shared ones.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import redis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import PostgresServer, RedisServer
from tests.support.servers import RabbitMQServer
from tests.support.work_units import (
    RABBITMQ_UNIT,
    FileUnitScheduling,
    check_rabbitmq_membership,
    unit_of,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

# No timing checks in property tests: the unit tests run beside end-to-end tests that keep
# both cores busy, so an example's wall time says how busy the machine was, not how good
# the code is (and performance is measured in bench/, never asserted in the suite).
hypothesis_settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("suite")

FIRST_TO_LAST = ("tests/e2e/", "tests/integration/", "tests/upstream/", "tests/unit/")
"""Where a test file's work unit queues, after the RabbitMQ unit: longest tests first."""


def _queue_rank(unit: str) -> int:
    if unit == RABBITMQ_UNIT:
        return 0
    for rank, folder in enumerate(FIRST_TO_LAST, start=1):
        if unit.startswith(folder):
            return rank
    return len(FIRST_TO_LAST) + 1


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> FileUnitScheduling | None:
    """The suite's work units (tests/support/work_units.py) for ``--dist loadgroup``."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return FileUnitScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Queue the suite's work units for the processes that share them (``-n 4``).

    Each test file is one work unit (its tests run in order in one process, so a module's
    fixtures start once), and every test file that uses RabbitMQ is in one unit of its own
    (tests/support/work_units.py says why and how). A process takes the next unit from the
    queue whenever it runs low, so they finish within about one file's time of each
    other; end-to-end files run beside each other, as they have since pytest 9 (the suite
    waits on real processes far more than it computes). The queue (``--no-loadscope-reorder``
    keeps this order) has the RabbitMQ unit first, then the end-to-end, integration,
    upstream and unit files, so the longest units start first and the many short unit
    tests fill the end. Each xdist worker has its own Redis and PostgreSQL (the session
    fixtures below), so two tests never share a server.
    """
    check_rabbitmq_membership(REPO_ROOT, items)
    ranks = {item.nodeid: _queue_rank(unit_of(REPO_ROOT, item.nodeid)) for item in items}
    items.sort(key=lambda item: ranks[item.nodeid])  # stable: each file keeps its order


@pytest.fixture(scope="session")
def servers_dir() -> Iterator[Path]:
    """Where the session's servers keep their files; deleted at the end (the servers
    stop first: their fixtures depend on this one)."""
    base = Path(tempfile.mkdtemp(prefix="platform-tests-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


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
    server.close()


@pytest.fixture(scope="session")
def migrated_database(postgres_server: PostgresServer) -> str:
    from platform_tasks.postgres.migrations import migrate

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
            if isinstance(server, PostgresServer):
                server.close()
            else:
                server.stop()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    os.chmod(tmp_path, 0o755)
    factory = ServerFactory(tmp_path)
    yield factory
    factory.stop_all()


@pytest.fixture(autouse=True)
def platform_loggers_as_configured_by_default() -> Iterator[None]:
    """Give every test the platform's loggers as a fresh process has them.

    Tests that run Celery or Django in this process (an in-process worker, a Django
    settings module, ``logging.config.dictConfig`` with ``disable_existing_loggers``) leave
    the loggers that existed then disabled, not propagating or at another level. A later
    test that reads its log lines through ``caplog`` would then see nothing, pass or fail by
    the order the tests ran in. The loggers are put back before each test.
    """
    manager = logging.Logger.manager
    for name, logger in list(manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split(".")[0] == "platform_tasks":
            logger.disabled = False
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
    yield
