"""App for the tenant-fairness tests: records the order in which jobs start, in Redis.

Each job appends ``<tenant>:<n>`` to a Redis list as its first step, so the list is the
start order across every worker process (Redis orders the pushes).
"""

from __future__ import annotations

import os

import redis

from platform_tasks import create_app

app = create_app("fair_app")
_results = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])

STARTS_KEY = "test:fair:starts"


@app.task(name="tests.fair_start")
def fair_start(envelope: dict) -> None:
    _results.rpush(STARTS_KEY, f"{envelope['tenant_id']}:{envelope['data']['n']}")
