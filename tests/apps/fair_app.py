"""App for the tenant-fairness tests: records the order in which jobs start, in Redis.

Each job appends ``<tenant>:<n>`` to a Redis list as its first step, so the list is the
start order across every worker process (Redis orders the pushes).
"""

from __future__ import annotations

import os
import time

import redis

from platform_tasks import create_app

app = create_app("fair_app")
_results = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])

STARTS_KEY = "test:fair:starts"


@app.task(name="tests.fair_start")
def fair_start(envelope: dict) -> None:
    _results.rpush(STARTS_KEY, f"{envelope['tenant_id']}:{envelope['data']['n']}")


HOLD_KEY = "test:fair:hold"


@app.task(name="tests.fair_hold")
def fair_hold(envelope: dict) -> None:
    """Starts like ``fair_start``, then holds its process until the test releases it."""
    fair_start(envelope)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _results.blpop([HOLD_KEY], timeout=1):
        continue  # short blocking reads: the client's socket timeout is 5 s
