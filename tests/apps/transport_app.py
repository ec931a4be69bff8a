"""App for transport fault tests and benchmarks: a no-op task that counts its runs.

The transport comes from ``PLATFORM_TRANSPORT`` like in production; the visibility
timeout can be shortened below the production minimum with
``TRANSPORT_TEST_VISIBILITY_SECONDS`` so restores happen within a test's time budget.
With ``TRANSPORT_TEST_GO_KEY`` set, a worker waits after booting until that Redis list
gets an item (see ``tests/e2e/brokers/test_transport_kill.py``).
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery.signals import worker_init

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
GO_WAIT_SECONDS = 180


def _wait_for_go(**_: Any) -> None:
    """Hold the booted worker before its pool and consumer start, until the test says go.

    The kill test starts workers ahead of their turn (imports and app set-up are most of
    a worker's start-up) and releases one at a time by pushing onto its go key.
    """
    key = os.environ["TRANSPORT_TEST_GO_KEY"]
    if _results.blpop([key], timeout=GO_WAIT_SECONDS) is None:
        raise SystemExit(f"no go on {key} within {GO_WAIT_SECONDS}s")


if os.environ.get("TRANSPORT_TEST_GO_KEY"):
    worker_init.connect(_wait_for_go, weak=False)


@app.task(name="transport.count")
def count(n: int) -> None:
    """Record one run of message ``n`` (a hash of run counts: duplicates show as > 1)."""
    _results.hincrby(SEEN_KEY, str(n), 1)


@app.task(name="transport.noop")
def noop() -> None:
    """Does nothing: what a benchmark of the broker path runs."""
