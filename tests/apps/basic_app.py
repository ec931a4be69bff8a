"""A minimal app for end-to-end tests: records every job it runs in Redis."""

from __future__ import annotations

import json
import os

import redis

from platform_tasks import create_app

app = create_app("basic_app")
_results = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])


@app.task(name="tests.record")
def record(envelope: dict) -> None:
    seconds, micros = _results.time()
    _results.hset("test:recorded_at", envelope["job_id"], f"{seconds}.{micros:06d}")
    _results.rpush("test:recorded", json.dumps(envelope))
