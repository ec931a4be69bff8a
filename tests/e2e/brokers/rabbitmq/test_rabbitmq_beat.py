"""Scheduled jobs on RabbitMQ: two ``celery -A app beat`` replicas, one worker, no ``-Q``.

The lease scheduler admits each point in Redis and sends its trigger through RabbitMQ
(the job queue is a quorum queue); the worker runs the handler, which writes one row per
run in PostgreSQL (no unique key, so a point run twice shows as two rows). Both replicas
consider every point; the test checks from their admission log lines and the rows that
each point was admitted once, by one replica, and applied once.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.e2e.brokers.rabbitmq.conftest import query, queue_types
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env
from tests.support.servers import RabbitMQServer

APP = "tests.apps.jobs_app"
JOBS = ("every_second_a", "every_second_b", "every_two_seconds")
ROWS_WANTED = 8

JOB_SOURCE = """
import os
from datetime import timedelta

import psycopg2

from platform_tasks.jobs import define_job


def run(ctx):
    conn = psycopg2.connect(os.environ["PLATFORM_DATABASE_URL"])
    try:
        with conn, conn.cursor() as cur:
            cur.execute("INSERT INTO public.job_runs (job, point_ms) VALUES (%s, %s)",
                        (ctx.name, int(ctx.scheduled_for.timestamp() * 1000)))
    finally:
        conn.close()


define_job(handler=run, interval=timedelta(seconds={interval}))
"""

ADMISSION = re.compile(
    r"job point job=(?P<job>\S+) point_ms=(?P<point>\d+) \S+ "
    r"outcome=(?P<outcome>\S+)"
)
RUN = re.compile(r"job run job=(?P<job>\S+) point_ms=(?P<point>\d+) outcome=(?P<outcome>\S+)")


def test_two_beat_replicas_admit_each_point_once_and_a_worker_applies_it_once(
    broker_settings: PlatformSettings, rabbitmq_server: RabbitMQServer, tmp_path: Path
) -> None:
    database_url = str(broker_settings.database_url)
    query(
        database_url,
        "CREATE TABLE IF NOT EXISTS public.job_runs (job text NOT NULL, "
        "point_ms bigint NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
    )
    query(database_url, "TRUNCATE public.job_runs")
    jobs = tmp_path / "beat_schedules"
    jobs.mkdir()
    for name in JOBS:
        (jobs / f"{name}.py").write_text(JOB_SOURCE.format(interval=2 if "two" in name else 1))
    env = platform_env(
        redis_url=broker_settings.redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_BROKER_URL": str(broker_settings.broker_url),
            "PLATFORM_JOBS_DIR": str(jobs),
        },
    )

    def rows() -> list[tuple[str, int]]:
        return [
            (job, int(point))
            for job, point in query(database_url, "SELECT job, point_ms FROM public.job_runs")
        ]

    with celery_processes() as started:
        worker = CeleryProcess(
            [
                CELERY,
                "-A",
                APP,
                "worker",
                "--loglevel",
                "INFO",
                "-c",
                "2",
                "--without-mingle",
                "--without-gossip",
            ],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=120)
        beats = [
            CeleryProcess(
                [
                    CELERY,
                    "-A",
                    APP,
                    "beat",
                    "--loglevel",
                    "INFO",
                    "-s",
                    str(tmp_path / f"beat{i}-schedule"),
                ],
                env=env,
                cwd=REPO_ROOT,
                log_path=tmp_path / f"beat{i}.log",
            ).start()
            for i in range(2)
        ]
        started.extend(beats)
        for beat in beats:
            beat.wait_for_log("beat scheduler ready", timeout=120)
        wait_until(
            lambda: len(rows()) >= ROWS_WANTED,
            timeout=90,
            message=f"{ROWS_WANTED} scheduled runs applied",
        )
        for beat in beats:
            beat.stop(timeout=30)
        admitted = [
            (m["job"], int(m["point"]))
            for beat in beats
            for m in ADMISSION.finditer(beat.log())
            if m["outcome"] == "admitted"
        ]

        def every_trigger_handled() -> bool:
            handled = {
                (m["job"], int(m["point"]))
                for m in RUN.finditer(worker.log())
                if m["outcome"] != "started"
            }
            return set(admitted) <= handled

        # triggers sent before the replicas stopped are still run (or judged late)
        wait_until(every_trigger_handled, timeout=60, message="every admitted point handled")
        worker.stop(timeout=30)
        outcomes = Counter(m["outcome"] for beat in beats for m in ADMISSION.finditer(beat.log()))
        runs = [(m["job"], int(m["point"]), m["outcome"]) for m in RUN.finditer(worker.log())]

    applied = rows()
    assert len(admitted) == len(set(admitted)), "a point was admitted twice"
    assert len(applied) == len(set(applied)), "a point was applied twice"
    started_points = [(job, point) for job, point, outcome in runs if outcome == "started"]
    assert len(started_points) == len(set(started_points)), "a trigger ran twice"
    assert set(applied) == set(started_points), "every run wrote its row, and only runs did"
    assert set(applied) <= set(admitted), "a run without an admission"
    late = [(job, point) for job, point, outcome in runs if outcome == "skipped_late_start"]
    assert set(applied) | set(late) == set(admitted), "an admitted point was lost"
    assert {job for job, _ in applied} == set(JOBS)
    # both replicas judged the same points: the one that lost a point was told so
    for beat in beats:
        mine = Counter(m["outcome"] for m in ADMISSION.finditer(beat.log()))
        assert mine["admitted"] + mine["skipped_duplicate"] > 0, (beat.log_path, mine)
    assert outcomes["skipped_duplicate"] > 0, outcomes
    assert queue_types(rabbitmq_server, broker_settings)["platform.jobs"] == "quorum"
