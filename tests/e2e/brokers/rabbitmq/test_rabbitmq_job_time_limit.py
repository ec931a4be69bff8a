"""On RabbitMQ a scheduled job runs as long as its lease allows, not consumer_timeout - 60 s.

The ``platform.jobs.run`` trigger is acknowledged when the worker receives it, so
RabbitMQ's ``consumer_timeout`` never concerns it; the hard time limit the platform
derives from that timeout for late-acknowledged tasks must not reach it either. The
node's ``consumer_timeout`` is lowered to 8 s for this test (channels opened after) and
the worker told the same value, so late-acknowledged tasks get a hard limit of 4 s. A job
(interval 30 s, ``lease_ttl`` 60 s) whose handler holds for 12 s, past both, must finish
once, uncut. ``celery -A tests.apps.jobs_app worker`` (no ``-Q``) and one ``celery beat``
replica run as the README starts them.
"""

from __future__ import annotations

from pathlib import Path

from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.e2e.brokers.rabbitmq.conftest import query
from tests.support.processes import (
    CELERY,
    CeleryProcess,
    celery_processes,
    platform_env,
    worker_argv,
)
from tests.support.servers import RabbitMQServer

APP = "tests.apps.jobs_app"
CONSUMER_TIMEOUT_SECONDS = 8
HOLD_SECONDS = 12

JOB_SOURCE = """
import os
from datetime import timedelta

import psycopg2

from platform_tasks.jobs import define_job


def record(ctx, phase):
    conn = psycopg2.connect(os.environ["PLATFORM_DATABASE_URL"])
    try:
        with conn, conn.cursor() as cur:
            cur.execute("INSERT INTO public.job_phases (job, point_ms, phase) VALUES (%s, %s, %s)",
                        (ctx.name, int(ctx.scheduled_for.timestamp() * 1000), phase))
    finally:
        conn.close()


def run(ctx):
    record(ctx, "started")
    # the job's own work: {hold} s, cut short only if the platform asks it to stop
    cancelled = ctx.cancel_requested.wait({hold})
    record(ctx, "cancelled" if cancelled else "finished")


define_job(handler=run, interval=timedelta(seconds=30), lease_ttl=timedelta(seconds=60))
"""


def test_a_scheduled_job_longer_than_the_consumer_timeout_cut_runs_to_its_end(
    broker_settings: PlatformSettings, rabbitmq_server: RabbitMQServer, tmp_path: Path
) -> None:
    database_url = str(broker_settings.database_url)
    query(
        database_url,
        "CREATE TABLE IF NOT EXISTS public.job_phases (job text NOT NULL, "
        "point_ms bigint NOT NULL, phase text NOT NULL)",
    )
    query(database_url, "TRUNCATE public.job_phases")
    jobs = tmp_path / "beat_schedules"
    jobs.mkdir()
    (jobs / "long_report.py").write_text(JOB_SOURCE.format(hold=HOLD_SECONDS))
    env = platform_env(
        redis_url=broker_settings.redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_BROKER_URL": str(broker_settings.broker_url),
            "PLATFORM_JOBS_DIR": str(jobs),
            "PLATFORM_RABBITMQ_CONSUMER_TIMEOUT_SECONDS": str(CONSUMER_TIMEOUT_SECONDS),
        },
    )

    def phases() -> list[tuple[int, str]]:
        return [
            (int(point), phase)
            for point, phase in query(database_url, "SELECT point_ms, phase FROM public.job_phases")
        ]

    rabbitmq_server.set_consumer_timeout(CONSUMER_TIMEOUT_SECONDS * 1000)
    try:
        with celery_processes() as started:
            worker = CeleryProcess(
                worker_argv(APP, concurrency=1),
                env=env,
                cwd=REPO_ROOT,
                log_path=tmp_path / "worker.log",
            ).start()
            started.append(worker)
            worker.wait_for_log("ready.", timeout=120)
            beat_argv = [
                CELERY,
                "-A",
                APP,
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(tmp_path / "beat-schedule"),
            ]
            beat = CeleryProcess(
                beat_argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / "beat.log"
            ).start()
            started.append(beat)
            beat.wait_for_log("beat scheduler ready", timeout=120)
            try:
                wait_until(
                    lambda: any(p == "started" for _, p in phases()),
                    timeout=90,
                    message="the job's first point started",
                )
                (point,) = {pt for pt, p in phases() if p == "started"}
                wait_until(
                    lambda: (
                        any(pt == point and p != "started" for pt, p in phases())
                        or "Hard time limit" in worker.log()
                    ),
                    timeout=HOLD_SECONDS + 60,
                    message="the run ended",
                )
                beat.stop(timeout=30)
            except (TimeoutError, AssertionError) as exc:
                raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log()[-6000:]}") from exc
            log = worker.log()
    finally:
        rabbitmq_server.set_consumer_timeout(1_800_000)
    assert "Hard time limit" not in log, log[-3000:]
    assert "TimeLimitExceeded" not in log
    assert "PRECONDITION_FAILED" not in log, "RabbitMQ cut the trigger's delivery"
    mine = sorted(p for pt, p in phases() if pt == point)
    assert mine == ["finished", "started"], mine
