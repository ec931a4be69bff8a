"""The consumer app with a platform step that fails before the delivery has a verdict.

The pipeline asks the app for the queue's retry policy before it claims the job. Here the
first ``STEP_FAULTS`` of those calls (counted in Redis across the worker's processes)
raise, standing in for any fault of the platform's own code outside the handler (a
collaborator that cannot be built, a dependency whose API changed). The wrapper is set on
the app instance because the fault must sit exactly there: in the platform's code, not in
the handler, whose errors the pipeline already settles.
"""

from __future__ import annotations

import os

import redis

from platform_tasks import RetryPolicy
from tests.apps.consumer_app import app

__all__ = ["FAULTS_KEY", "app"]

FAULTS_KEY = "test:step_faults"
_faults = int(os.environ.get("STEP_FAULTS", "0"))
_redis = redis.Redis.from_url(os.environ.get("PLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0"))
_policy_for = app.retry_policy_for


def _faulty_policy_for(queue: str | None) -> RetryPolicy:
    if int(_redis.incr(FAULTS_KEY)) <= _faults:
        raise RuntimeError("a platform step failed before the verdict")
    return _policy_for(queue)


app.retry_policy_for = _faulty_policy_for  # type: ignore[method-assign]
