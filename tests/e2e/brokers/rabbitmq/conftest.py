"""Fixtures shared by the RabbitMQ end-to-end tests.

Workers start the way the README says (no ``-Q``), with ``PLATFORM_BROKER_URL`` pointing at
a fresh virtual host of the session's RabbitMQ node; Redis stays the platform's own Redis
and PostgreSQL holds the work rows (``public.consumer_work``, one row per application, so a
job applied twice shows as two rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL
from tests.conftest import REPO_ROOT
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv
from tests.support.servers import RabbitMQServer


def applied(database_url: str, job_id: object) -> int:
    rows = query(
        database_url, "SELECT count(*) FROM public.consumer_work WHERE job_id = %s", str(job_id)
    )
    return int(rows[0][0])


def vhost_of(settings: PlatformSettings) -> str:
    return str(settings.broker_url).rsplit("/", 1)[1]


def queue_types(server: RabbitMQServer, settings: PlatformSettings) -> dict[str, str]:
    """Every queue of the test's virtual host and its type (``quorum``, ``classic``)."""
    out = server.ctl(
        "list_queues", "-p", vhost_of(settings), "--quiet", "--no-table-headers", "name", "type"
    )
    return dict(line.split("\t") for line in out.splitlines() if "\t" in line)  # type: ignore[misc]


@pytest.fixture
def broker_settings(rabbitmq_url: str, redis_url: str, database_url: str) -> PlatformSettings:
    query(database_url, WORK_TABLE_SQL)
    query(database_url, "TRUNCATE public.consumer_work")
    return PlatformSettings.build(
        broker_url=rabbitmq_url, redis_url=redis_url, database_url=database_url, profile="test"
    )


@pytest.fixture
def port(broker_settings: PlatformSettings) -> Iterator[QueuePort]:
    app = create_app("rabbitmq_e2e_producer", settings=broker_settings, task_default_queue=QUEUE)
    qp = QueuePort(app)
    yield qp
    qp.close()
    app.close()


class Workers:
    """Starts ``celery -A <app> worker`` (no ``-Q``) on the RabbitMQ vhost."""

    def __init__(
        self, settings: PlatformSettings, tmp_path: Path, started: list[CeleryProcess]
    ) -> None:
        self.env = platform_env(
            redis_url=settings.redis_url,
            database_url=settings.database_url,
            extra={"PLATFORM_BROKER_URL": str(settings.broker_url)},
        )
        self.tmp_path = tmp_path
        self.started = started

    def start(
        self,
        name: str = "w1",
        *,
        app: str = "tests.apps.consumer_app",
        concurrency: int = 1,
        **extra: str,
    ) -> CeleryProcess:
        argv = worker_argv(app, concurrency=concurrency, hostname=f"{name}@%h")
        proc = CeleryProcess(
            argv, env={**self.env, **extra}, cwd=REPO_ROOT, log_path=self.tmp_path / f"{name}.log"
        )
        self.started.append(proc.start())
        proc.wait_for_log("ready.", timeout=120)
        return proc


@pytest.fixture
def workers(broker_settings: PlatformSettings, tmp_path: Path) -> Iterator[Workers]:
    with celery_processes() as started:
        yield Workers(broker_settings, tmp_path, started)
