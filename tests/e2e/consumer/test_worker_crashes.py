"""Real ``celery worker`` processes killed mid-handler: applied once, crash loops end."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.envelope import uuid7
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL, runs_key
from tests.conftest import REPO_ROOT
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

MAX_ATTEMPTS = 3


@pytest.fixture
def port(settings: PlatformSettings) -> Iterator[QueuePort]:
    query(str(settings.database_url), WORK_TABLE_SQL)
    query(str(settings.database_url), "TRUNCATE public.consumer_work")
    app = create_app("consumer_e2e_producer", settings=settings)
    qp = QueuePort(app)
    yield qp
    qp.close()
    app.close()


@pytest.fixture(params=["platform", "stock"])
def worker(
    redis_url: str, database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[CeleryProcess]:
    """A worker on either Redis transport: both must mark a restored message redelivered."""
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "5",
            "CONSUMER_TEST_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
            "PLATFORM_TRANSPORT": request.param,
        },
    )
    with celery_processes() as started:
        argv = worker_argv("tests.apps.consumer_app", concurrency=1)
        proc = CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / "worker.log")
        proc.start()
        started.append(proc)
        proc.wait_for_log("ready.", timeout=60)
        yield proc


def payload(key: str, **data: Any) -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": "t1",
        "kind": "tests.consumer.apply",
        "data": {"key": key, **data},
    }


def test_sigkill_in_the_middle_of_a_handler_is_redelivered_and_applied_once(
    worker: CeleryProcess, port: QueuePort, redis_client: redis.Redis, database_url: str
) -> None:
    job = payload("killed", block=True)
    port.publish(QUEUE, job)
    wait_until(lambda: redis_client.llen("test:started") == 1, timeout=30, message="started")
    _, pid = redis_client.lindex("test:started", 0).decode().rsplit(":", 1)
    assert int(pid) in worker.children()
    os.kill(int(pid), signal.SIGKILL)
    redis_client.set(f"test:release:{job['job_id']}", 1)

    def applied() -> bool:
        return query(database_url, "SELECT count(*) FROM core.processed_jobs")[0][0] == 1

    wait_until(applied, timeout=60, message="job applied after redelivery")
    assert query(database_url, "SELECT job_id::text FROM public.consumer_work") == [
        (job["job_id"],)
    ]
    assert int(redis_client.get(runs_key(job["job_id"]))) == 2
    assert query(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]


def test_crash_loop_is_dead_lettered_after_max_attempts_deliveries(
    worker: CeleryProcess, port: QueuePort, redis_client: redis.Redis, database_url: str
) -> None:
    job = payload("crasher", crash_times=1000)
    port.publish(QUEUE, job)

    def dead_lettered() -> bool:
        return bool(query(database_url, "SELECT 1 FROM core.dead_letters"))

    wait_until(dead_lettered, timeout=80, message="crash-looping job dead-lettered")
    ((reason, attempts, job_id, stored, last_error),) = query(
        database_url,
        "SELECT reason, attempts, job_id::text, payload, last_error FROM core.dead_letters",
    )
    assert (reason, attempts, job_id) == ("crash_loop", MAX_ATTEMPTS, job["job_id"])
    assert stored["data"] == job["data"]
    assert "crash loop" in last_error
    assert int(redis_client.get(runs_key(job["job_id"]))) == MAX_ATTEMPTS
    assert query(database_url, "SELECT count(*) FROM public.consumer_work") == [(0,)]
    # the worker keeps serving: a healthy job still applies
    healthy = payload("after")
    port.publish(QUEUE, healthy)
    wait_until(
        lambda: query(database_url, "SELECT count(*) FROM public.consumer_work")[0][0] == 1,
        timeout=30,
        message="healthy job applied",
    )
