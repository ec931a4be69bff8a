"""The last line of defence: a delivery the platform could not settle goes back, unacked.

Every outcome of a handler is settled by the delivery pipeline (applied, retried,
dead-lettered, waiting). What is left is the platform's own code failing *before* it
reached a verdict — a collaborator that cannot be built, a bug, a dependency whose API
changed under a fresh install. Celery would record such an error as the task's failure
and, with ``acks_late`` and acks on failure, acknowledge the message: the job would be
gone with no dead letter. Instead the delivery is rejected with ``requeue=True`` after a
short, growing pause (so a persistent fault neither spins the worker nor floods its log):
the job waits in its queue and runs once the fault is gone. A redelivery is counted as
one (the crash-loop budget), so a fault that never clears ends as a dead letter, which is
also a record.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.exceptions import Ignore, Reject, Retry

from platform_tasks.errors import DeadLettered

__all__ = ["VERDICT_RAISES", "requeue_unsettled", "settled"]

logger = logging.getLogger("platform_tasks.consumer")

VERDICT_RAISES: tuple[type[BaseException], ...] = (Retry, DeadLettered, Reject, Ignore)
"""What the pipeline raises *as* a verdict (a stored retry, a written dead letter) or what
Celery itself uses for flow control: passed through untouched."""

FIRST_PAUSE_SECONDS = 0.5
LONGEST_PAUSE_SECONDS = 30.0

_lock = threading.Lock()
_pause = FIRST_PAUSE_SECONDS


def requeue_unsettled(task_name: str, request: Any, exc: BaseException) -> Reject:
    """Log ``exc`` as a platform step failure, pause, and return the ``Reject`` to raise.

    The pause doubles with each consecutive failure in this process, up to
    :data:`LONGEST_PAUSE_SECONDS`, and starts over after a delivery that settled (see
    :func:`settled`).
    """
    global _pause
    job_id = getattr(request, "id", None)
    with _lock:
        pause = _pause
        _pause = min(_pause * 2, LONGEST_PAUSE_SECONDS)
    logger.error(
        "the platform could not settle a delivery of %s (%s: %s); it goes back to its queue",
        task_name,
        type(exc).__name__,
        exc,
        exc_info=exc,
        extra={"event": "consumer.step_failed", "job_id": job_id, "task": task_name},
    )
    time.sleep(pause)
    return Reject(f"not settled: {type(exc).__name__}; requeued", requeue=True)


def settled() -> None:
    """A delivery settled: the next unsettled one pauses only briefly again."""
    global _pause
    _pause = FIRST_PAUSE_SECONDS
