"""An app whose jobs end up in each state ``jobs show`` answers (tests/e2e/jobs_status).

``tests.status.work`` does what its data says: ``output`` returns it as the recorded
output, ``fail`` raises (retried an hour later: queue ``status`` retries slowly),
``permanent`` raises a PermanentError (a dead letter), ``big`` returns more than the
output cap (a dead letter, OutputRefused), ``hold`` reports progress and then runs
until ``test:release:<job id>`` exists in Redis. ``tests.status.capped`` lets one job
per tenant run at a time (the next waits ten minutes in the delay store) and
``tests.status.throttled`` one job per tenant an hour.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import redis
from pydantic import BaseModel

from platform_tasks import Envelope, PermanentError, PlatformTask, RetryPolicy, create_app
from platform_tasks.jobs_status import report_progress

QUEUE = "status"
PAUSED_QUEUE = "status_paused"

app = create_app(
    "status_app",
    task_default_queue=QUEUE,
    retry_policies={
        QUEUE: RetryPolicy(
            max_attempts=3,
            base=timedelta(hours=1),
            cap=timedelta(hours=2),
            rationale="a retry stays in the delay store while the test reads it",
        )
    },
)
_redis = redis.Redis.from_url(os.environ.get("PLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0"))


class Work(BaseModel):
    mode: str = "ok"
    output: Any = None


@app.task(name="tests.status.work", base=PlatformTask, data_model=Work)
def work(envelope: Envelope[Work], tx: Any) -> Any:
    return _do(envelope)


def _tenant(envelope: Envelope[Any]) -> str | None:
    return envelope.tenant_id


@app.task(
    name="tests.status.capped",
    base=PlatformTask,
    data_model=Work,
    concurrency_key=_tenant,
    max_concurrency=1,
    concurrency_retry=600,
)
def capped(envelope: Envelope[Work], tx: Any) -> Any:
    return _do(envelope)


@app.task(
    name="tests.status.throttled",
    base=PlatformTask,
    data_model=Work,
    throttle_key=_tenant,
    throttle="1/h",
)
def throttled(envelope: Envelope[Work], tx: Any) -> Any:
    return _do(envelope)


def _do(envelope: Envelope[Work]) -> Any:
    mode = envelope.data.mode
    if mode == "fail":
        raise RuntimeError("the upstream answered 503")
    if mode == "permanent":
        raise PermanentError("the invoice does not exist")
    if mode == "big":
        return {"blob": "x" * 5000}
    if mode == "hold":
        _hold(str(envelope.job_id))
    return envelope.data.output


def _hold(job: str) -> None:
    for done in range(1, 1001):
        report_progress(done, 1000, "rows imported")  # a tight loop: one write a second
    deadline = time.monotonic() + 120
    while not _redis.exists(f"test:release:{job}") and time.monotonic() < deadline:
        report_progress(1000, 1000, "rows imported")  # written once the second is over
        time.sleep(0.05)  # the job's own work, until the test releases it
