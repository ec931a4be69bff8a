"""An app with a second declared queue whose retry policy differs from the default.

``ledger`` is declared by the application itself (``task_queues``), behind its own topic
exchange, with a routing key that is not its name (``ledger.entries``) and as a quorum
queue, as an application on RabbitMQ declares it. The task names no queue of its own:
the producer chooses the queue (``publish("ledger", …)``), so the only way a retry finds
its way back to ``ledger`` and to ``ledger``'s policy is the delivery's own routing.

Every run is counted in Redis (``test:runs:<job_id>``) and the exchange the delivery came
through is appended to ``test:exchanges:<job_id>``, so a test can see that a retry came
back through RabbitMQ's native delayed delivery. The work is one row in
``public.consumer_work`` (no unique key: a job applied twice shows as two rows).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import redis
from kombu import Exchange, Queue
from pydantic import BaseModel

from platform_tasks import Envelope, PlatformTask, RetryPolicy, create_app

DEFAULT_QUEUE = "consumer"
LEDGER_QUEUE = "ledger"
LEDGER_ROUTING_KEY = "ledger.entries"
LEDGER_MAX_ATTEMPTS = 3

_QUORUM = {"x-queue-type": "quorum"}
QUEUES = [
    Queue(
        DEFAULT_QUEUE,
        Exchange(DEFAULT_QUEUE, type="topic"),
        routing_key=DEFAULT_QUEUE,
        queue_arguments=_QUORUM,
    ),
    Queue(
        LEDGER_QUEUE,
        Exchange(LEDGER_QUEUE, type="topic"),
        routing_key=LEDGER_ROUTING_KEY,
        queue_arguments=_QUORUM,
    ),
]

app = create_app(
    "ledger_app",
    retry_policies={
        LEDGER_QUEUE: RetryPolicy(
            max_attempts=LEDGER_MAX_ATTEMPTS,
            base=timedelta(seconds=1),
            cap=timedelta(seconds=1),
            rationale="tests: a policy unlike the default (5 attempts, 30 s) shows which applied",
        )
    },
    task_default_queue=DEFAULT_QUEUE,
    task_queues=QUEUES,
)
_redis = redis.Redis.from_url(os.environ.get("PLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0"))


class Entry(BaseModel):
    key: str
    fail_times: int = 0


def runs_key(job_id: object) -> str:
    return f"test:runs:{job_id}"


def exchanges_key(job_id: object) -> str:
    return f"test:exchanges:{job_id}"


@app.task(name="tests.ledger.apply", base=PlatformTask, data_model=Entry)
def apply_entry(envelope: Envelope[Entry], tx: Any) -> str:
    job = str(envelope.job_id)
    runs = int(_redis.incr(runs_key(job)))
    info = apply_entry.request.delivery_info or {}
    _redis.rpush(exchanges_key(job), str(info.get("exchange") or ""))
    tx.execute(
        "INSERT INTO public.consumer_work (job_id, key) VALUES (%s, %s)", (job, envelope.data.key)
    )
    if runs <= envelope.data.fail_times:
        raise RuntimeError(f"failure {runs} of {envelope.data.fail_times}")
    return job
