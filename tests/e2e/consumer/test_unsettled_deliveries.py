"""A fault of the platform's own code before a verdict never acknowledges the job.

A real worker of ``tests.apps.step_fault_app`` (the consumer app whose retry-policy lookup,
a platform step before the claim, fails for its first calls) consumes five jobs. Celery
would record each such fault as the task's failure and acknowledge the message, losing the
job with no dead letter; the platform puts the delivery back instead, so every job is
applied exactly once after the fault is gone.
"""

from __future__ import annotations

from pathlib import Path

import psycopg2
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL
from tests.apps.step_fault_app import FAULTS_KEY
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

FAULTS = 3
JOBS = 5


def test_a_platform_step_failing_before_the_verdict_requeues_the_job(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(WORK_TABLE_SQL)
        cur.execute("TRUNCATE public.consumer_work")
    redis.Redis.from_url(redis_url).delete(FAULTS_KEY)
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    port = QueuePort(create_app("step_fault_producer", settings=settings))
    env = platform_env(
        redis_url=redis_url, database_url=database_url, extra={"STEP_FAULTS": str(FAULTS)}
    )

    def applied() -> list[str]:
        with conn.cursor() as cur:
            cur.execute("SELECT job_id::text FROM public.consumer_work")
            return [row[0] for row in cur.fetchall()]

    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.step_fault_app", concurrency=1),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.")
        job_ids = {
            str(
                port.publish(
                    QUEUE,
                    {
                        "tenant_id": "acme",
                        "kind": "tests.consumer.apply",
                        "data": {"key": f"k{n}"},
                    },
                )
            )
            for n in range(JOBS)
        }
        try:
            wait_until(lambda: set(applied()) == job_ids, timeout=60, message="every job applied")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {applied()}\n{worker.log()[-4000:]}") from exc
        log = worker.log()
    port.close()
    rows = applied()
    conn.close()
    assert sorted(rows) == sorted(job_ids), "each job applied exactly once"
    assert log.count("it goes back to its queue") == FAULTS, log[-4000:]
    assert "raised unexpected" not in log, "a fault was recorded as the task's failure"
