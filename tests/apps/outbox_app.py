"""A PlatformTask app for the transactional outbox tests.

``tests.outbox.apply`` writes one row into ``public.outbox_effects`` (no unique key: a
job applied twice shows as two rows) inside its transaction ``tx``. The payload chooses
the rest:

- ``follow_up``: the handler publishes a follow-up job (same task, ``key`` + ``/next``)
  without a ``tx`` and without a job id: it joins the handler's transaction and gets an
  id derived from this job's;
- ``fail_times``: the first runs raise after the follow-up was published (runs are
  counted in ``public.outbox_runs``, outside the job's transaction, so a rolled back run
  still counts).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import psycopg2
from pydantic import BaseModel

from platform_tasks import Envelope, PlatformTask, QueuePort, RetryPolicy, create_app

QUEUE = "outbox"
TASK = "tests.outbox.apply"

TABLES_SQL = (
    "CREATE TABLE IF NOT EXISTS public.outbox_effects ("
    " job_id uuid NOT NULL, key text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());"
    "CREATE TABLE IF NOT EXISTS public.outbox_runs (job_id uuid NOT NULL)"
)

app = create_app(
    "outbox_app",
    retry_policies={
        QUEUE: RetryPolicy(
            max_attempts=3,
            base=timedelta(milliseconds=200),
            cap=timedelta(milliseconds=200),
            rationale="tests: a retry within the test's time box",
        )
    },
    task_default_queue=QUEUE,
)
_port: QueuePort | None = None


class Effect(BaseModel):
    key: str
    follow_up: bool = False
    fail_times: int = 0


def _count_run(job_id: str) -> int:
    conn = psycopg2.connect(os.environ["PLATFORM_DATABASE_URL"])
    try:
        with conn, conn.cursor() as cur:
            cur.execute("INSERT INTO public.outbox_runs (job_id) VALUES (%s)", (job_id,))
            cur.execute("SELECT count(*) FROM public.outbox_runs WHERE job_id = %s", (job_id,))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


@app.task(name=TASK, base=PlatformTask, data_model=Effect)
def apply_effect(envelope: Envelope[Effect], tx: Any) -> None:
    global _port
    job = str(envelope.job_id)
    data = envelope.data
    tx.execute("INSERT INTO public.outbox_effects (job_id, key) VALUES (%s, %s)", (job, data.key))
    if data.follow_up:
        if _port is None:
            _port = QueuePort(app)
        _port.publish(
            QUEUE,
            {"tenant_id": envelope.tenant_id, "kind": TASK, "data": {"key": f"{data.key}/next"}},
        )
    if data.fail_times and _count_run(job) <= data.fail_times:
        raise RuntimeError(f"failing run of {job} on purpose")
