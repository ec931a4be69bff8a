"""Worker app of ``bench/transport_throughput.py``: a Celery no-op and a PlatformTask no-op."""

from __future__ import annotations

import time
from typing import Any

from platform_tasks import PlatformTask, create_app

app = create_app("transport_bench")


@app.task(name="bench.noop")
def noop() -> None:
    """Does nothing: only the broker path and Celery's own work are measured."""


@app.task(name="bench.platform_noop", base=PlatformTask)
def platform_noop(envelope: Any, tx: Any) -> None:
    """Does nothing beyond what PlatformTask does: validation and the idempotency commit."""


_stamps: Any = None


@app.task(name="bench.stamp")
def stamp(sent: float) -> None:
    """Records (publish time, start time) for ``bench/transport_latency.py``."""
    global _stamps
    if _stamps is None:
        import os

        import redis

        _stamps = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])
    _stamps.rpush("bench:stamps", f"{sent!r} {time.time()!r}")
