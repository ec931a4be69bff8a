"""App for transport fault tests and benchmarks: a no-op task that counts its runs.

The transport comes from ``PLATFORM_TRANSPORT`` like in production; the visibility
timeout can be shortened below the production minimum with
``TRANSPORT_TEST_VISIBILITY_SECONDS`` so restores happen within a test's time budget.
"""

from __future__ import annotations

import os

import redis

from platform_tasks import create_app

_visibility = float(os.environ.get("TRANSPORT_TEST_VISIBILITY_SECONDS", "300"))
app = create_app(
    "transport_app",
    broker_transport_options={"visibility_timeout": _visibility},
    # Events are not what these tests measure; without them a cycle is shorter.
    worker_send_task_events=os.environ.get("TRANSPORT_TEST_EVENTS", "0") == "1",
    task_send_sent_event=False,
)
_results = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])

SEEN_KEY = "test:transport:seen"


@app.task(name="transport.count")
def count(n: int) -> None:
    """Record one run of message ``n`` (a hash of run counts: duplicates show as > 1)."""
    _results.hincrby(SEEN_KEY, str(n), 1)


@app.task(name="transport.noop")
def noop() -> None:
    """Does nothing: what a benchmark of the broker path runs."""
