"""A PlatformTask app for fault and soak tests: one effect row per applied job.

The handler inserts ``job_id`` into ``public.effects`` inside the transaction ``tx`` it is
given. The table deliberately has no unique key: a job applied twice would show as two
rows. The payload chooses the rest:

- ``hold_ms`` keeps the transaction open that long (``pg_sleep``) so a server stopped
  mid-run catches jobs in the middle of their transaction;
- ``gate`` (a PostgreSQL advisory lock key) makes the job wait, inside its transaction,
  until the test releases the lock it holds: a gate that needs neither Redis nor time;
- ``fail_times`` makes the first runs fail with a retryable error, ``permanent`` raises
  :class:`~platform_tasks.PermanentError`. Only then are runs counted, in Redis
  (``test:faults:runs:<job_id>``), so tests that restart Redis never touch it from a
  handler.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import redis
from pydantic import BaseModel

from platform_tasks import Envelope, PermanentError, PlatformTask, RetryPolicy, create_app

QUEUE = "faults"
TASK = "tests.faults.apply"
MAX_ATTEMPTS = 3

EFFECTS_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS public.effects ("
    " job_id uuid NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
)

app = create_app(
    "fault_app",
    retry_policies={
        QUEUE: RetryPolicy(
            max_attempts=MAX_ATTEMPTS,
            base=timedelta(seconds=1),
            cap=timedelta(seconds=2),
            rationale="tests: waits of one to two seconds keep the soak within its time box",
        )
    },
    task_default_queue=QUEUE,
)

_redis: redis.Redis | None = None


class Effect(BaseModel):
    hold_ms: int = 0
    gate: int = 0
    fail_times: int = 0
    permanent: bool = False


def runs_key(job_id: object) -> str:
    return f"test:faults:runs:{job_id}"


def _count_run(job_id: str) -> int:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])
    return int(_redis.incr(runs_key(job_id)))


@app.task(name=TASK, base=PlatformTask, data_model=Effect)
def apply_effect(envelope: Envelope[Effect], tx: Any) -> None:
    job = str(envelope.job_id)
    data = envelope.data
    tx.execute("INSERT INTO public.effects (job_id) VALUES (%s)", (job,))
    if data.hold_ms:
        tx.execute("SELECT pg_sleep(%s)", (data.hold_ms / 1000,))
    if data.gate:
        tx.execute("SELECT pg_advisory_xact_lock_shared(%s)", (data.gate,))
    if data.fail_times or data.permanent:
        runs = _count_run(job)
        if data.permanent:
            raise PermanentError(f"job {job} can never succeed")
        if runs <= data.fail_times:
            raise RuntimeError(f"failure {runs} of {data.fail_times}")
