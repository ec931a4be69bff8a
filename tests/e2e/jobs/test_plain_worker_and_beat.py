"""The commands the README and docker-compose give, with no ``-Q``: scheduled jobs run.

``celery -A celery_app worker --loglevel INFO`` and ``celery -A celery_app beat --loglevel
INFO``, from the repository root like the compose services, with the shipped
``beat_schedules/`` copied into a temporary folder (``PLATFORM_JOBS_DIR``) plus a job a
new user adds: a 1 s interval job. The shipped purge and stale-dead-letter report run
too, their cron shortened to every minute by their documented settings, so the test
waits for the next minute boundary (at most about a minute).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg2
import pytest

from tests.conftest import REPO_ROOT
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env

HELLO = """
from datetime import timedelta
from platform_tasks.jobs import define_job

def run(ctx):
    ctx.logger.info("hello from %s at %s", ctx.name, ctx.scheduled_for.isoformat())

job = define_job(handler=run, interval=timedelta(seconds=1))
"""


def _execute(database_url: str, sql: str) -> None:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def _count(database_url: str, sql: str) -> int:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            (value,) = cur.fetchone()
            return int(value)
    finally:
        conn.close()


@pytest.mark.slow
def test_plain_worker_and_beat_run_a_new_job_and_the_shipped_platform_jobs(
    tmp_path: Path, redis_url: str, database_url: str
) -> None:
    jobs = tmp_path / "beat_schedules"
    shutil.copytree(
        REPO_ROOT / "beat_schedules", jobs, ignore=shutil.ignore_patterns("__pycache__")
    )
    (jobs / "hello.py").write_text(HELLO)
    _execute(
        database_url,
        "INSERT INTO core.processed_jobs (job_id, consumer, processed_at) "
        "SELECT gen_random_uuid(), 'old', now() - interval '40 days' "
        "FROM generate_series(1, 7)",
    )
    _execute(
        database_url,
        "INSERT INTO core.dead_letters (queue, kind, payload, reason, status, created_at) "
        "VALUES ('billing', 'billing.charge', '{}'::jsonb, 'poison', 'pending_review', "
        "now() - interval '30 hours')",
    )
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_JOBS_DIR": str(jobs),
            "PLATFORM_PROCESSED_JOBS_PURGE_CRON": "* * * * *",
            "PLATFORM_DEAD_LETTER_REPORT_CRON": "* * * * *",
        },
    )

    with celery_processes() as started:
        worker = CeleryProcess(
            [CELERY, "-A", "celery_app", "worker", "--loglevel", "INFO"],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=90)
        beat = CeleryProcess(
            [CELERY, "-A", "celery_app", "beat", "--loglevel", "INFO"],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "beat.log",
        ).start()
        started.append(beat)
        beat.wait_for_log("beat scheduler ready", timeout=90)

        # the added job runs within its interval (plus start-up of the trigger path)
        worker.wait_for_log("hello from hello at", timeout=60)
        # the shipped jobs run at the next minute boundary
        worker.wait_for_log("purged 7 processed-job rows", timeout=150)
        worker.wait_for_log("1 stale dead letter(s)", timeout=30)
        log = worker.log()

    # the 40-day-old rows are gone; jobs applied in the same minute (the shipped fan-out
    # jobs' own idempotency rows, committed as the worker stops) are new rows and stay
    old_rows = "SELECT count(*) FROM core.processed_jobs WHERE consumer = 'old'"
    assert _count(database_url, old_rows) == 0
    assert "does not consume platform queue" not in log, log[-4000:]
    assert "platform.jobs" in log.split("[tasks]")[0], "the banner lists the job queue"
