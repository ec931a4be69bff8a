"""A PlatformTask app whose tasks choose their own queues, as Celery users write them.

- ``billing.charge`` declares ``queue="billing"`` on the task itself and nothing else
  names that queue: a worker started without ``-Q`` consumes it because it is a
  PlatformTask's own queue;
- ``ledger.post`` is routed to queue ``ledger``, whose binding uses routing key
  ``ledger.entries`` (a queue name that differs from its routing key);
- ``secrets.leak`` returns and raises values that carry its payload data, so tests can
  check what task events (and so Flower) show.

Each handler fails the first ``fail_times`` runs (counted in Redis) and then writes one
row to ``public.routing_work``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import redis
from kombu import Exchange, Queue
from pydantic import BaseModel

from platform_tasks import Envelope, PermanentError, PlatformTask, RetryPolicy, create_app

WORK_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS public.routing_work (job_id uuid NOT NULL, task text NOT NULL)"
)
FAST = RetryPolicy(
    max_attempts=3,
    base=timedelta(seconds=1),
    cap=timedelta(seconds=1),
    rationale="tests: a one-second retry keeps the routing test short",
)

app = create_app(
    "routing_app",
    retry_policies={"billing": FAST, "ledger": FAST, "default": FAST},
    task_queues=[
        Queue("default", Exchange("default"), routing_key="default"),
        Queue("ledger", Exchange("ledger"), routing_key="ledger.entries"),
    ],
    task_routes={"ledger.post": {"queue": "ledger"}},
)
_redis = redis.Redis.from_url(os.environ.get("PLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0"))


class Work(BaseModel):
    fail_times: int = 0
    secret: str = ""
    permanent: bool = False


def runs_key(job_id: object) -> str:
    return f"test:routing:runs:{job_id}"


def _work(envelope: Envelope[Work], tx: Any, task: str) -> None:
    runs = int(_redis.incr(runs_key(envelope.job_id)))
    if runs <= envelope.data.fail_times:
        raise RuntimeError(f"failure {runs}: {envelope.data.secret}")
    tx.execute(
        "INSERT INTO public.routing_work (job_id, task) VALUES (%s, %s)",
        (str(envelope.job_id), task),
    )


@app.task(
    base=PlatformTask,
    name="billing.charge",
    queue="billing",
    data_model=Work,
    soft_time_limit=60,
    time_limit=90,
    acks_late=True,
    priority=3,
)
def charge(envelope: Envelope[Work], tx: Any) -> None:
    _work(envelope, tx, "billing.charge")


@app.task(base=PlatformTask, name="ledger.post", data_model=Work)
def post(envelope: Envelope[Work], tx: Any) -> None:
    _work(envelope, tx, "ledger.post")


@app.task(base=PlatformTask, name="secrets.leak", data_model=Work)
def leak(envelope: Envelope[Work], tx: Any) -> dict[str, str]:
    _work(envelope, tx, "secrets.leak")
    if envelope.data.permanent:
        raise PermanentError(f"cannot charge card {envelope.data.secret}")
    return {"card": envelope.data.secret}
