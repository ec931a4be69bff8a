"""A Celery app whose periodic tasks live in django-celery-beat's tables.

Beat runs ``-S platform_tasks.contrib.django_celery_beat:LeaseDatabaseScheduler``; the
module is what a new user writes: ``create_app`` and the task, nothing installed by hand
(the app's workers renew and release the lease of each run by themselves).
``tests.django_beat.record`` appends one JSON line per run to the Redis list
``test:dcb:runs``: the periodic task's label, the point from the lease header, and when
the run started and ended. A trigger the worker discards because it expired (it waited in
the queue past its period) is appended with ``expired: true``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery.signals import task_revoked

from platform_tasks import create_app
from platform_tasks.contrib.beat_leases import LeaseGrant

RUNS = "test:dcb:runs"

app = create_app("django_beat_app")
_redis = redis.Redis.from_url(os.environ.get("PLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0"))


@app.task(name="tests.django_beat.record", bind=True)
def record(self: Any, label: str, seconds: float = 0.0) -> None:
    grant = LeaseGrant.from_request(self.request)
    started = time.time()
    if seconds:
        time.sleep(seconds)  # the task's work: long enough to overlap its next point
    _redis.rpush(
        RUNS,
        json.dumps(
            {
                "label": label,
                "point_ms": grant.point_ms if grant else None,
                "start": started,
                "end": time.time(),
                "pid": os.getpid(),
            }
        ),
    )


@task_revoked.connect
def _record_expired(request: Any = None, expired: bool = False, **_: Any) -> None:
    grant = LeaseGrant.from_request(request)
    if expired and grant is not None:
        _redis.rpush(
            RUNS,
            json.dumps(
                {
                    "label": request.args[0],
                    "point_ms": grant.point_ms,
                    "expired": True,
                }
            ),
        )
