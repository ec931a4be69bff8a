"""App for the task-event tests: a job that succeeds, one that fails, one held by the test."""

from __future__ import annotations

import os

import redis

from platform_tasks import create_app
from platform_tasks.observability.event_batching import BatchingEventDispatcher, PlatformEvents

app = create_app("events_app")

if os.environ.get("TEST_EVENTS_FLUSH_INTERVAL"):
    # A flush timer longer than the test: only the flush at consumer stop can publish.

    class SlowTimerDispatcher(BatchingEventDispatcher):
        flush_interval = float(os.environ["TEST_EVENTS_FLUSH_INTERVAL"])

    class SlowTimerEvents(PlatformEvents):
        dispatcher_cls = SlowTimerDispatcher

    app.events_cls = SlowTimerEvents
_redis = redis.Redis.from_url(os.environ["PLATFORM_REDIS_URL"])

HOLDING_KEY = "test:events:holding"
RELEASE_KEY = "test:events:release"


@app.task(name="tests.events.done")
def done(envelope: dict) -> None:
    """Succeeds at once."""


@app.task(name="tests.events.broken")
def broken(envelope: dict) -> None:
    """Fails at once (Flower shows FAILURE)."""
    raise ValueError(f"job {envelope['job_id']} fails on purpose")


@app.task(name="tests.events.held")
def held(envelope: dict) -> None:
    """Runs until the test pushes onto the release list (at most 60 s)."""
    _redis.rpush(HOLDING_KEY, envelope["job_id"])
    _redis.blpop([RELEASE_KEY], timeout=60)
