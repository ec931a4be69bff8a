"""Worker app for transport fault tests: tasks that count their runs outside the broker.

The broker is ``PLATFORM_BROKER_URL``; the counters live on ``PLATFORM_REDIS_URL``, a
different Redis server, so a broker made to answer error replies (``maxmemory 1``) does
not also break the accounting. The visibility timeout is the platform setting
``PLATFORM_VISIBILITY_TIMEOUT_SECONDS``, as an operator would set it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from platform_tasks import create_app

app = create_app(
    "transport_worker_app",
    # Events are not what these tests look at; Flower is not running.
    worker_send_task_events=False,
    task_send_sent_event=False,
)
_counters = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])

APPLIED_KEY = "test:transport:applied"
"""Hash: job number -> how many times its task body completed."""
STARTED_KEY = "test:transport:started"
"""Hash: job number -> how many times its task body started."""
RUNNER_KEY = "test:transport:runner"
"""Hash: job number -> hostname of the worker that last started it."""


@app.task(name="transport_faults.count", bind=True)
def count(self: Any, n: int, seconds: float = 0.0, seconds_again: float | None = None) -> None:
    """Run for ``seconds``, then record one completed run of job ``n``.

    ``seconds_again``, when given, is how long every later start of the same job runs
    (a redelivered copy whose delivery is what a test checks need not hold as long).
    """
    _counters.hset(RUNNER_KEY, str(n), str(self.request.hostname))
    starts = _counters.hincrby(STARTED_KEY, str(n), 1)
    if starts > 1 and seconds_again is not None:
        seconds = seconds_again
    time.sleep(seconds)  # the task's work: what keeps its message in flight
    _counters.hincrby(APPLIED_KEY, str(n), 1)
