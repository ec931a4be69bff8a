"""A PlatformTask stopped by its hard ``time_limit`` in a real prefork ``celery worker``.

Celery's pool kills the process running a task past its hard time limit; the job must
not go with it. Each stop is a failed attempt: retried with the queue's retry policy, and
dead-lettered after the last attempt with an error that names the time limit. The handler
writes its work row before it blocks, so a job applied twice would show as two rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.envelope import uuid7
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, TIME_LIMIT_SECONDS, WORK_TABLE_SQL, Work, runs_key
from tests.conftest import REPO_ROOT
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

MAX_ATTEMPTS = 3
KIND = "tests.consumer.time_limited"


@pytest.fixture
def port(settings: PlatformSettings) -> Iterator[QueuePort]:
    query(str(settings.database_url), WORK_TABLE_SQL)
    query(str(settings.database_url), "TRUNCATE public.consumer_work")
    app = create_app("time_limit_e2e_producer", settings=settings)
    qp = QueuePort(app)
    yield qp
    qp.close()
    app.close()


@pytest.fixture(params=["platform", "stock"])
def worker(
    redis_url: str, database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[CeleryProcess]:
    """A prefork worker on either Redis transport (the broker is the platform's Redis)."""
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "CONSUMER_TEST_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
            "PLATFORM_TRANSPORT": request.param,
        },
    )
    with celery_processes() as started:
        argv = worker_argv("tests.apps.consumer_app", concurrency=1)
        proc = CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / "worker.log")
        started.append(proc.start())
        proc.wait_for_log("ready.", timeout=60)
        yield proc


def payload(key: str, **data: Any) -> dict[str, Any]:
    return {"job_id": str(uuid7()), "tenant_id": "t1", "kind": KIND, "data": {"key": key, **data}}


def work_rows(database_url: str, job_id: str) -> int:
    rows = query(
        database_url, "SELECT count(*) FROM public.consumer_work WHERE job_id = %s", job_id
    )
    return int(rows[0][0])


def test_a_job_that_always_exceeds_its_hard_time_limit_is_retried_then_dead_lettered(
    worker: CeleryProcess, port: QueuePort, redis_client: redis.Redis, database_url: str
) -> None:
    job = payload("hangs", hang_times=1000)
    port.publish(QUEUE, job)

    def dead_letter() -> list[tuple[Any, ...]]:
        return query(
            database_url,
            "SELECT reason, attempts, error_type, last_error, payload "
            "FROM core.dead_letters WHERE job_id = %s",
            job["job_id"],
        )

    wait_until(
        lambda: bool(dead_letter()),
        timeout=120,
        message="job stopped by its time limit dead-lettered",
    )
    ((reason, attempts, error_type, last_error, stored),) = dead_letter()
    assert (reason, attempts) == ("retries_exhausted", MAX_ATTEMPTS)
    assert error_type == "platform_tasks.errors.HardTimeLimitExceeded"
    assert f"hard time limit of {TIME_LIMIT_SECONDS:g}s" in last_error
    # retries carry the validated envelope, so the kept data has the model's defaults
    assert stored["data"] == Work.model_validate(job["data"]).model_dump()
    # every attempt ran (and was stopped) once: retried, not dropped and not looped
    assert int(redis_client.get(runs_key(job["job_id"]))) == MAX_ATTEMPTS
    assert redis_client.llen("test:hanging") == MAX_ATTEMPTS
    assert work_rows(database_url, job["job_id"]) == 0, "a stopped attempt's work rolled back"
    assert query(database_url, "SELECT count(*) FROM core.processed_jobs") == [(0,)]
    assert worker.log().count("Hard time limit") >= MAX_ATTEMPTS


def test_a_job_stopped_once_by_its_time_limit_is_applied_once_on_its_retry(
    worker: CeleryProcess, port: QueuePort, redis_client: redis.Redis, database_url: str
) -> None:
    job = payload("hangs-once", hang_times=1)
    port.publish(QUEUE, job)
    wait_until(
        lambda: work_rows(database_url, job["job_id"]) == 1,
        timeout=90,
        message="job applied on its retry",
    )
    assert int(redis_client.get(runs_key(job["job_id"]))) == 2
    assert query(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]
    # the worker keeps serving: another job still applies, and nothing ran a third time
    other = payload("after")
    port.publish(QUEUE, other)
    wait_until(
        lambda: work_rows(database_url, other["job_id"]) == 1,
        timeout=60,
        message="later job applied",
    )
    assert work_rows(database_url, job["job_id"]) == 1
    assert int(redis_client.get(runs_key(job["job_id"]))) == 2
