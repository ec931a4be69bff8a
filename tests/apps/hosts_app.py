"""App for the across-hosts test: published jobs and scheduled jobs, each leaving a row.

A published job (``tests.hosts.apply``) inserts its ``job_id`` and the address of the
host that applied it (``inet_client_addr()``, as PostgreSQL sees the connection) into
``public.host_work`` inside the consumer's transaction, then holds the transaction open
``hold_ms`` (``pg_sleep``, its job id in the statement, so ``pg_stat_activity`` shows
which host is in the middle of which job). The table has no unique key: a job applied
twice would show as two rows.

Scheduled jobs come from ``PLATFORM_JOBS_DIR``; the test writes their files. Beat logs
every considered point at DEBUG (logger ``platform_tasks.jobs.points``), which the test
reads, so this app turns that one logger on.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from platform_tasks import Envelope, PlatformTask, RetryPolicy, create_app

QUEUE = "hosts"
TASK = "tests.hosts.apply"

WORK_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS public.host_work ("
    " job_id uuid NOT NULL, host inet, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
RUNS_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS public.host_job_runs ("
    " job text NOT NULL, point_ms bigint NOT NULL, host inet, started_ms bigint NOT NULL,"
    " recorded_at timestamptz NOT NULL DEFAULT clock_timestamp())"
)

logging.getLogger("platform_tasks.jobs.points").setLevel(logging.DEBUG)

app = create_app(
    "hosts_app",
    retry_policies={
        QUEUE: RetryPolicy(
            max_attempts=3,
            base=timedelta(seconds=1),
            cap=timedelta(seconds=2),
            rationale="tests: a retried job comes back within the test's minute",
        )
    },
    task_default_queue=QUEUE,
)


class Work(BaseModel):
    hold_ms: int = 0


@app.task(name=TASK, base=PlatformTask, data_model=Work)
def apply_work(envelope: Envelope[Work], tx: Any) -> None:
    job = str(envelope.job_id)
    tx.execute(
        "INSERT INTO public.host_work (job_id, host) VALUES (%s, inet_client_addr())", (job,)
    )
    if envelope.data.hold_ms:
        tx.execute("SELECT pg_sleep(%s), %s AS held_job", (envelope.data.hold_ms / 1000, job))
