"""pytest fixtures for testing a project's consumers against real servers.

A team that declared ``@app.task(base=PlatformTask, ...)`` tests it the way it runs: a
real Redis and a real PostgreSQL (started from binaries by :mod:`platform_tasks.testing.servers`,
or the servers the user names), schema ``core`` migrated, the team's app bound to them,
and Celery's own embedded test worker (``celery.contrib.testing.worker.start_worker``,
the one ``celery.contrib.pytest`` and pytest-celery build on; no Docker) running the
team's tasks in the test process. ``platform_jobs.publish(...)`` hands a job to the queue
port and ``platform_jobs.wait(job_id)`` returns what its delivery came to::

    def test_an_order_is_recorded_once(platform_jobs, platform_db):
        job_id = platform_jobs.publish("default", {"tenant_id": "acme",
                                                   "kind": "shop.record_order",
                                                   "data": {"order_id": 7}})
        assert platform_jobs.wait(job_id).status == "applied"

The outcome of a delivery is what the consumer pipeline decided for it (its hooks, see
:mod:`platform_tasks.consumer.hooks`), completed from the database: the idempotency row
for ``applied``, the ``core.dead_letters`` row for ``dead_lettered``. The worker's
pipeline calls the kit's hook after the verdict was settled (retry stored in the delay
store, dead letter committed), so a returned outcome is already durable.

Scopes: servers, app and worker live for the session (a worker start costs seconds);
every test that uses ``platform_jobs`` or ``platform_db`` starts with the ``core`` tables
empty (``TRUNCATE``, plus the tables ``platform_truncate_tables`` names) and an empty
delay store. Redis is not flushed: the worker's queue bindings live there, and job ids
are new per publish, so tests never see each other's jobs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psycopg2
import psycopg2.extras
import pytest

from platform_tasks.postgres.queries import load_queries
from platform_tasks.publishing.outbox import JOIN
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.outcomes import (
    JobOutcome,
    OutcomeRecorder,
    RecordedDelivery,
    Status,
    install_recorder,
)

if TYPE_CHECKING:
    from celery.worker import WorkController
    from psycopg2.extensions import connection as Connection

    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "DATABASE_URL_VARIABLE",
    "REDIS_URL_VARIABLE",
    "JobOutcome",
    "OutcomeRecorder",
    "PlatformJobs",
    "RecordedDelivery",
    "Status",
    "empty_delay_store",
    "install_recorder",
]

REDIS_URL_VARIABLE = "PLATFORM_TEST_REDIS_URL"
DATABASE_URL_VARIABLE = "PLATFORM_TEST_DATABASE_URL"

_SQL = load_queries("testing")


@dataclass
class PlatformJobs:
    """Publish jobs through the app's queue port and wait for what their deliveries came to.

    Each :meth:`wait` returns the next delivery of the job that no earlier ``wait`` of
    this test returned: publish a job id twice and two waits give ``applied`` then
    ``duplicate``.
    """

    app: PlatformCelery
    database_url: str
    recorder: OutcomeRecorder
    default_timeout: float = 30.0
    _seen: dict[uuid.UUID, int] = field(default_factory=dict)
    _port: Any = None

    @property
    def port(self) -> Any:
        """The app's :class:`~platform_tasks.publishing.queue_port.QueuePort`."""
        if self._port is None:
            from platform_tasks.publishing.queue_port import QueuePort

            self._port = QueuePort(self.app)
        return self._port

    def publish(
        self,
        queue: str,
        payload: Mapping[str, Any],
        opts: Mapping[str, Any] | None = None,
        *,
        tx: Any = JOIN,
    ) -> uuid.UUID:
        """``QueuePort.publish``: validate, publish now, return the job id.

        ``tx`` as for the port: a connection or cursor in a transaction makes the job an
        outbox row of that transaction, published by the worker's relay once it commits
        (rolled back, :meth:`wait` never sees it)."""
        job_id: uuid.UUID = self.port.publish(queue, payload, opts, tx=tx)
        return job_id

    def schedule(
        self,
        queue: str,
        payload: Mapping[str, Any],
        run_at: datetime,
        opts: Mapping[str, Any] | None = None,
        *,
        tx: Any = JOIN,
    ) -> uuid.UUID:
        """``QueuePort.schedule``, ``tx`` included: the job id."""
        job_id: uuid.UUID = self.port.schedule(queue, payload, run_at, opts, tx=tx)
        return job_id

    def schedule_many(
        self,
        queue: str,
        items: Sequence[tuple[Mapping[str, Any], datetime]],
        opts: Mapping[str, Any] | None = None,
        *,
        tx: Any = JOIN,
    ) -> list[uuid.UUID]:
        """``QueuePort.schedule_many``, ``tx`` included: the job ids, in order."""
        job_ids: list[uuid.UUID] = self.port.schedule_many(queue, items, opts, tx=tx)
        return job_ids

    def wait(self, job_id: uuid.UUID | str, timeout: float | None = None) -> JobOutcome:
        """The job's next delivery outcome; ``TimeoutError`` when none comes in ``timeout``
        seconds (default 30), saying what the database holds for the job."""
        key = uuid.UUID(str(job_id))
        index = self._seen.get(key, 0)
        limit = self.default_timeout if timeout is None else timeout
        event = self.recorder.wait_for(key, index, time.monotonic() + limit)
        if event is None:
            raise TimeoutError(
                f"no delivery of job {key} settled within {limit:.1f}s "
                f"({index} settled before; {self._state(key)})"
            )
        self._seen[key] = index + 1
        return self._outcome(event)

    def outcomes(self, job_id: uuid.UUID | str) -> list[JobOutcome]:
        """Every delivery outcome of the job recorded in this test so far, in order."""
        return [self._outcome(e) for e in self.recorder.events(uuid.UUID(str(job_id)))]

    def _outcome(self, event: RecordedDelivery) -> JobOutcome:
        processed_at: datetime | None = None
        dead_letter: dict[str, Any] | None = None
        if event.status == "applied" and event.job_id is not None:
            row = self._one("processed_at", job_id=str(event.job_id), consumer=event.consumer)
            processed_at = row["processed_at"] if row is not None else None
        if event.dead_letter_id is not None:
            dead_letter = self._one("dead_letter_row", id=event.dead_letter_id)
        return JobOutcome(
            status=event.status,
            job_id=event.job_id,
            attempt=event.attempt,
            reason=event.reason,
            retry_at=event.retry_at,
            error_type=event.error_type,
            processed_at=processed_at,
            dead_letter=dead_letter,
            consumer=event.consumer,
        )

    def _one(self, query: str, **params: Any) -> dict[str, Any] | None:
        conn = psycopg2.connect(self.database_url)
        psycopg2.extras.register_uuid(conn_or_curs=conn)
        try:
            with conn, conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
                cur.execute(_SQL[query], params)
                row = cur.fetchone()
                return dict(row) if row is not None else None
        finally:
            conn.close()

    def _state(self, job_id: uuid.UUID) -> str:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM core.processed_jobs WHERE job_id = %s", (str(job_id),)
                )
                processed = cur.fetchone()[0]
                cur.execute(
                    "SELECT count(*) FROM core.dead_letters WHERE job_id = %s", (str(job_id),)
                )
                dead = cur.fetchone()[0]
        finally:
            conn.close()
        return f"core.processed_jobs rows: {processed}, core.dead_letters rows: {dead}"


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def platform_servers_dir() -> Iterator[Path]:
    """Where the servers the kit starts keep their files (removed at the end)."""
    base = Path(tempfile.mkdtemp(prefix="platform-test-servers-"))
    os.chmod(base, 0o755)  # PostgreSQL runs as nobody when the tests run as root
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def platform_redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """``PLATFORM_TEST_REDIS_URL``, else a ``redis-server`` started for the session.

    Override the fixture to use another server. The session's Redis is private, so it
    is never flushed by the kit; a server you name is not flushed either.
    """
    supplied = os.environ.get(REDIS_URL_VARIABLE)
    if supplied:
        yield supplied
        return
    from platform_tasks.testing.servers import RedisServer

    base: Path = request.getfixturevalue("platform_servers_dir")
    server = RedisServer(base / "redis", appendonly=False).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def platform_database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """``PLATFORM_TEST_DATABASE_URL``, else a PostgreSQL started for the session; migrated
    (``platform-tasks migrate``) either way. Override the fixture to use another server."""
    from platform_tasks.postgres.migrations import migrate

    supplied = os.environ.get(DATABASE_URL_VARIABLE)
    if supplied:
        migrate(supplied)
        yield supplied
        return
    from platform_tasks.testing.servers import PostgresServer

    base: Path = request.getfixturevalue("platform_servers_dir")
    server = PostgresServer(base / "postgres" / "data").start()
    try:
        migrate(server.url)
        yield server.url
    finally:
        server.close()


@pytest.fixture(scope="session")
def platform_environment(
    platform_redis_url: str, platform_database_url: str
) -> Iterator[dict[str, str]]:
    """Sets ``PLATFORM_REDIS_URL``, ``PLATFORM_DATABASE_URL`` (and clears
    ``PLATFORM_BROKER_URL``) to the test servers for the session, and
    ``PLATFORM_PROFILE=test``, ``PLATFORM_DELAY_POLL_INTERVAL_SECONDS=0.1`` unless set.
    An app module imported after this fixture (``create_app`` reads the environment)
    is bound to the test servers. The previous values come back at the end."""
    values = {
        "PLATFORM_REDIS_URL": platform_redis_url,
        "PLATFORM_DATABASE_URL": platform_database_url,
    }
    defaults = {"PLATFORM_PROFILE": "test", "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1"}
    names = [*values, *defaults, "PLATFORM_BROKER_URL"]
    saved = {name: os.environ.get(name) for name in names}
    os.environ.pop("PLATFORM_BROKER_URL", None)
    os.environ.update(values)
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    try:
        yield {name: os.environ[name] for name in [*values, *defaults]}
    finally:
        for name, previous in saved.items():
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous


@pytest.fixture(scope="session")
def platform_settings(platform_environment: dict[str, str]) -> PlatformSettings:
    """The :class:`~platform_tasks.settings.PlatformSettings` of the test servers (the
    environment of :func:`platform_environment`): pass it to your app factory as
    ``create_app(..., settings=platform_settings)``."""
    from platform_tasks.settings import PlatformSettings

    return PlatformSettings.from_env()


@pytest.fixture(scope="session")
def platform_celery_app() -> PlatformCelery:
    """Your app. Override it (session scope) in your ``conftest.py``: build the app with
    ``settings=platform_settings``, or import your app module inside the fixture after
    ``platform_environment``."""
    pytest.fail(
        "override the platform_celery_app fixture in conftest.py to return your app, e.g.\n"
        "    @pytest.fixture(scope='session')\n"
        "    def platform_celery_app(platform_environment):\n"
        "        from myproject.celery_app import app\n"
        "        return app"
    )


@pytest.fixture(scope="session")
def platform_app(
    platform_celery_app: PlatformCelery, platform_redis_url: str, platform_database_url: str
) -> PlatformCelery:
    """``platform_celery_app``, checked to point at the test servers, with the outcome
    recorder installed and no scheduled jobs run by its workers (``job_scheduler``
    tests those)."""
    from platform_tasks.jobs.runtime import mark_test_app

    app = platform_celery_app
    settings = getattr(app, "platform_settings", None)
    if settings is None:
        pytest.fail("platform_celery_app must return an app built with platform_tasks.create_app")
    wrong = [
        name
        for name, have, want in (
            ("PLATFORM_REDIS_URL", settings.redis_url, platform_redis_url),
            ("PLATFORM_DATABASE_URL", settings.database_url, platform_database_url),
        )
        if have != want
    ]
    if settings.broker_url not in (None, platform_redis_url):
        wrong.append("PLATFORM_BROKER_URL")  # the test worker consumes the test Redis
    if wrong:
        pytest.fail(
            f"platform_celery_app is not bound to the test servers ({', '.join(wrong)} "
            "differ): build it with settings=platform_settings, or import its module "
            "inside the fixture after platform_environment (not at the top of a test "
            "module or conftest.py)"
        )
    mark_test_app(app)
    install_recorder(app)
    return app


@pytest.fixture(scope="session")
def platform_worker_parameters() -> Mapping[str, Any]:
    """Extra keyword arguments for ``start_worker`` (``loglevel``, ``hostname``,
    ``shutdown_timeout``...), like ``celery.contrib.pytest``'s ``celery_worker_parameters``."""
    return {}


@pytest.fixture(scope="session")
def platform_worker(
    platform_app: PlatformCelery, platform_worker_parameters: Mapping[str, Any]
) -> Iterator[WorkController]:
    """Celery's embedded test worker (``start_worker``: solo pool, a thread of the test
    process) consuming every queue a plain ``celery -A app worker`` would.

    No ping check: it needs a result backend, and platform apps ignore results.
    """
    from celery.contrib.testing.worker import start_worker

    options: dict[str, Any] = {
        "pool": "solo",
        "concurrency": 1,
        "loglevel": "WARNING",
        "shutdown_timeout": 30.0,
    }
    options.update(platform_worker_parameters)
    with start_worker(platform_app, perform_ping_check=False, **options) as worker:
        yield worker


def empty_delay_store(settings: PlatformSettings) -> Literal["redis", "rabbitmq"] | None:
    """Remove every waiting delay of ``settings``' deployment, wherever it is kept, and say
    which store that was (``None``: RabbitMQ's native delayed delivery, nothing to empty).

    ``platform_db`` calls it before each test, so a delay left by one test is never
    promoted into the next one. The store is on the broker's Redis for a Redis broker and
    on the platform's Redis for ``PLATFORM_RABBITMQ_DELAYS=delay_store``; an ``amqp://``
    broker URL is never opened as a Redis URL.
    """
    from platform_tasks.brokers.delay_location import delay_store_location

    location = delay_store_location(settings)
    if location is None:
        return None
    client, keys = location.connect(), location.keys
    try:
        client.delete(keys.schedule)  # one key per call: the keys may sit on cluster nodes
        client.delete(keys.entries)
        client.delete(keys.claimed)
    finally:
        client.close()
    return location.kind


@pytest.fixture
def platform_truncate_tables() -> Sequence[str]:
    """Your own tables to empty before each test (``("public.orders",)``); none by default."""
    return ()


@pytest.fixture
def platform_db(
    platform_app: PlatformCelery,
    platform_database_url: str,
    platform_truncate_tables: Sequence[str],
) -> Iterator[Connection]:
    """A connection (autocommit) to the test database, after emptying the ``core`` tables,
    the tables of ``platform_truncate_tables`` and the delay store."""
    conn = psycopg2.connect(platform_database_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(_SQL["platform_tables"])
            tables = [row[0] for row in cur.fetchall()] + list(platform_truncate_tables)
            if tables:
                cur.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        empty_delay_store(platform_app.platform_settings)
        yield conn
    finally:
        conn.close()


@pytest.fixture
def platform_jobs(
    platform_app: PlatformCelery,
    platform_worker: WorkController,
    platform_db: Connection,
    platform_database_url: str,
) -> Iterator[PlatformJobs]:
    """:class:`PlatformJobs` for the running worker: ``publish(queue, payload)`` and
    ``wait(job_id, timeout=30)``; the test starts with empty platform tables."""
    recorder = install_recorder(platform_app)
    recorder.clear()
    yield PlatformJobs(platform_app, platform_database_url, recorder)
    recorder.clear()
