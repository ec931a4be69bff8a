"""A plain ``Celery()`` app (not built by ``create_app``) that does not install lease
renewal: what a team with its own Celery app runs before adding the line of
docs/django-celery-beat.md.

``tests.plain_lease.record`` appends its label to the Redis list ``test:plain-lease:runs``.
"""

from __future__ import annotations

import os

import redis
from celery import Celery

RUNS = "test:plain-lease:runs"

app = Celery("plain_celery_lease_app", broker=os.environ["PLATFORM_REDIS_URL"])
app.conf.update(accept_content=["json"], task_serializer="json", task_ignore_result=True)
_redis = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])


@app.task(name="tests.plain_lease.record")
def record(label: str) -> None:
    _redis.rpush(RUNS, label)
