"""The task of the outbox latency benchmark: a PlatformTask that records when it started."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from platform_tasks import PlatformTask, create_app

app = create_app("bench_outbox", task_default_queue="bench_outbox")
_redis = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])


@app.task(name="bench.started", base=PlatformTask)
def started(envelope: Any, tx: Any) -> None:
    _redis.hset("bench:started", str(envelope.job_id), time.time())


if os.environ.get("BENCH_SWITCH_INTERVAL"):  # probing the relay thread's wait for the GIL
    import sys

    sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))
