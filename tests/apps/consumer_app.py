"""A PlatformTask app for consumer tests: a handler whose behaviour the payload chooses.

Every run of the handler is counted in Redis (``test:runs:<job_id>``) before it does
anything, so tests can compare dead-letter attempt counts with how often the handler
really ran. The work is one row in ``public.consumer_work`` (no unique key: a job applied
twice would show as two rows).
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from typing import Any

import redis
from pydantic import BaseModel

from platform_tasks import Envelope, PermanentError, PlatformTask, RetryPolicy, create_app
from platform_tasks.testing.servers import wait_until

QUEUE = "consumer"
MAX_ATTEMPTS = int(os.environ.get("CONSUMER_TEST_MAX_ATTEMPTS", "3"))
TIME_LIMIT_SECONDS = 3
"""The hard time limit of ``tests.consumer.time_limited``: the pool kills a run past it."""

WORK_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS public.consumer_work ("
    " job_id uuid NOT NULL, key text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
)

app = create_app(
    "consumer_app",
    retry_policies={
        QUEUE: RetryPolicy(
            max_attempts=MAX_ATTEMPTS,
            base=timedelta(seconds=1),
            cap=timedelta(seconds=2),
            rationale="tests: short waits keep fault and soak tests within a minute",
        )
    },
    task_default_queue=QUEUE,
)
# CONSUMER_TEST_RUNS_REDIS_URL: a single Redis for the runs counter when the platform's
# own Redis is a Redis Cluster (PLATFORM_REDIS_CLUSTER=true)
_redis = redis.Redis.from_url(
    os.environ.get("CONSUMER_TEST_RUNS_REDIS_URL")
    or os.environ.get("PLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0")
)


class Work(BaseModel):
    key: str
    fail_times: int = 0
    permanent: bool = False
    crash_times: int = 0
    block: bool = False
    value_error: bool = False
    hang_times: int = 0
    """Runs (counted from the first) that block until the hard time limit stops them."""


class Unfixable(Exception):
    """Listed in permanent_errors: dead-lettered at once."""


def runs_key(job_id: object) -> str:
    return f"test:runs:{job_id}"


@app.task(
    name="tests.consumer.apply", base=PlatformTask, data_model=Work, permanent_errors=(Unfixable,)
)
def apply_work(envelope: Envelope[Work], tx: Any) -> str:
    return _apply(envelope, tx)


@app.task(
    name="tests.consumer.time_limited",
    base=PlatformTask,
    data_model=Work,
    time_limit=TIME_LIMIT_SECONDS,
)
def apply_within_time_limit(envelope: Envelope[Work], tx: Any) -> str:
    """The same work under a hard time limit; ``hang_times`` runs block past it."""
    return _apply(envelope, tx)


def _apply(envelope: Envelope[Work], tx: Any) -> str:
    job = str(envelope.job_id)
    runs = int(_redis.incr(runs_key(job)))
    data = envelope.data
    tx.execute("INSERT INTO public.consumer_work (job_id, key) VALUES (%s, %s)", (job, data.key))
    if runs <= data.hang_times:
        _redis.rpush("test:hanging", f"{job}:{os.getpid()}")
        wait_until(lambda: _redis.exists(f"test:release:{job}"), timeout=300, interval=0.05)
    if data.block:
        _redis.rpush("test:started", f"{job}:{os.getpid()}")
        wait_until(lambda: _redis.exists(f"test:release:{job}"), timeout=120, interval=0.05)
    if runs <= data.crash_times:
        os.kill(os.getpid(), signal.SIGKILL)
    if data.permanent:
        raise PermanentError(f"permanent failure of {data.key}")
    if data.value_error:
        raise Unfixable("listed in permanent_errors")
    if runs <= data.fail_times:
        raise RuntimeError(f"failure {runs} of {data.fail_times}")
    return job
