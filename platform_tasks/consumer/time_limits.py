"""A PlatformTask stopped by its hard ``time_limit``: a failed attempt, never a lost job.

Celery's prefork pool kills the process running a task past its hard time limit, and
with ``acks_late`` Celery then acknowledges the message (``acks_on_timeout``, which the
platform's ``task_acks_on_failure_or_timeout=True`` turns on): the job was neither
applied, retried nor dead-lettered. The child is killed, so nothing of the pipeline runs
in it; only the worker's main process learns why the attempt ended, when billiard calls
the request's ``on_failure`` with ``TimeLimitExceeded`` (before it calls ``on_timeout``
and before it kills the child).

So a PlatformTask does not acknowledge on a timeout (``acks_on_timeout = False``: Celery
requeues the message), and :class:`StoppedAttemptRequest` first writes the limit into
the job's delivery hash (:meth:`~platform_tasks.consumer.attempts.DeliveryCounter.
stopped_at_time_limit`). The message comes back marked redelivered; its next delivery
waits on the claim until the killed process's transaction is gone, finds the record and
settles the stopped attempt without running the handler again: a retry with the queue's
backoff, or, after the last attempt, a dead letter whose error
(:class:`~platform_tasks.errors.HardTimeLimitExceeded`) names the limit.

If Redis does not take the record (one try, a short timeout: this runs in the main
process's event loop), the message is requeued all the same and its redelivery is
counted like a worker killed mid-handler: it runs again, and ends as a crash-loop dead
letter after ``max_attempts`` deliveries. Never lost either way.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from celery.exceptions import TimeLimitExceeded

from platform_tasks.brokers.redis_client import REDIS_ERRORS, build_redis
from platform_tasks.consumer.attempts import DeliveryCounter, delivery_ttl_seconds
from platform_tasks.consumer.delivery import consumed_queue
from platform_tasks.consumer.event_redaction import PlatformRequest
from platform_tasks.keys import delivery_keys

logger = logging.getLogger(__name__)

RECORD_TIMEOUT_SECONDS = 2.0
"""How long the main process waits for Redis to take the record before it requeues anyway."""


class StoppedAttemptRequest(PlatformRequest):
    """The worker-side request of a PlatformTask: redacted task events (its base), and a
    hard time limit recorded as a failed attempt before the message goes back."""

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback wraps it
        task = self.task
        if (
            isinstance(exc, TimeLimitExceeded)
            and not self.acknowledged
            and task.acks_late
            and not task.acks_on_timeout
        ):
            seconds = exc.args[0] if exc.args else None
            record_stop(task, self, float(seconds or task.time_limit or 0))
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )


def record_stop(task: Any, request: Any, seconds: float) -> bool:
    """Write that this delivery was stopped at ``seconds``; False if Redis did not take it.

    Never raises: it runs in the worker's main process, and the message is requeued
    whatever happens here.
    """
    job_id = _job_id(request)
    if job_id is None:  # not an envelope: its redelivery is a poison dead letter anyway
        return False
    settings = task.app.platform_settings
    queue = consumed_queue(task, getattr(request, "delivery_info", None) or {})
    ttl = delivery_ttl_seconds(
        task.app.retry_policy_for(queue), settings.visibility_timeout_seconds
    )
    counter = DeliveryCounter(
        None,
        delivery_keys(settings.profile),
        connect=lambda: build_redis(settings, timeout=RECORD_TIMEOUT_SECONDS),
    )
    fields = {
        "event": "consumer.time_limit_stopped",
        "job_id": job_id,
        "queue": queue,
        "kind": task.name,
        "time_limit_seconds": seconds,
    }
    try:
        counter.stopped_at_time_limit(task.name, job_id, seconds=seconds, ttl_seconds=ttl)
    except REDIS_ERRORS as exc:
        logger.error(
            "job %s hit its hard time limit of %gs and Redis did not take the record (%s); "
            "requeued: its redelivery counts as a crash",
            job_id,
            seconds,
            type(exc).__name__,
            extra={**fields, "event": "consumer.time_limit_not_recorded"},
        )
        return False
    except Exception:
        logger.exception(
            "could not record the time limit of job %s; requeued",
            job_id,
            extra={**fields, "event": "consumer.time_limit_not_recorded"},
        )
        return False
    finally:
        _close_quietly(counter)
    logger.warning(
        "job %s was stopped at its hard time limit of %gs; requeued to settle the attempt",
        job_id,
        seconds,
        extra=fields,
    )
    return True


def _close_quietly(counter: DeliveryCounter) -> None:
    """Close the record's own Redis client; a failure is only logged, as record_stop must
    never raise in the worker's main process."""
    try:
        counter.close()
    except Exception:
        logger.debug(
            "closing the record's Redis client failed",
            exc_info=True,
            extra={"event": "consumer.time_limit_client_not_closed"},
        )


def _job_id(request: Any) -> str | None:
    args = getattr(request, "args", None)
    payload = args[0] if isinstance(args, list | tuple) and len(args) == 1 else None
    if not isinstance(payload, dict):
        return None
    try:
        return str(uuid.UUID(str(payload.get("job_id"))))
    except ValueError:
        return None
