"""Worker app of ``bench/fair_dispatch.py``: a job that records when it started."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from platform_tasks import create_app

app = create_app("fair_bench")
_redis = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])


@app.task(name="bench.fair_stamp")
def fair_stamp(envelope: dict[str, Any]) -> None:
    """Counts the start; a job with ``sent`` in its data also records its start delay."""
    sent = envelope["data"].get("sent")
    pipe = _redis.pipeline(transaction=False)
    pipe.incr("bench:fair:started")
    if sent is not None:
        delay = time.time() - float(sent)
        pipe.rpush("bench:fair:delays", f"{envelope['tenant_id']} {delay!r}")
    pipe.execute()
