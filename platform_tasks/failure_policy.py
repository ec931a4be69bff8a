"""What happens to a job after its handler fails: a pure function of attempt and error.

Kept apart from the task class (and free of Celery, Redis and PostgreSQL) so the rules
can be tested exhaustively: a job runs at most ``policy.max_attempts`` times whatever
Celery's own ``max_retries`` says, :class:`~platform_tasks.errors.PermanentError` and the
task's ``permanent_errors`` never retry, and every retry waits the jittered backoff of
:func:`~platform_tasks.retry.compute_backoff`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from platform_tasks.errors import PermanentError
from platform_tasks.retry import RetryPolicy, compute_backoff

RETRY = "retry"
PERMANENT = "permanent_error"
EXHAUSTED = "retries_exhausted"
CRASH_LOOP = "crash_loop"
POISON = "poison"


@dataclass(frozen=True)
class FailureDecision:
    """Retry after ``delay``, or dead-letter with ``reason`` (``delay`` is then ``None``)."""

    reason: str
    delay: timedelta | None = None

    @property
    def retry(self) -> bool:
        return self.reason == RETRY


def attempt_number(header_attempt: Any, spent: int) -> int:
    """The attempt this delivery is: the header, or one past the attempts already spent.

    The header (``platform_attempt``) travels with the message and survives redelivery;
    ``spent`` (failed attempts plus redeliveries after a worker died, counted in Redis)
    also sees attempts of duplicate copies of the job and crashes that never published a
    retry.
    """
    try:
        header = int(header_attempt)
    except (TypeError, ValueError):
        header = 1
    return max(1, header, max(0, spent) + 1)


def decide(
    policy: RetryPolicy,
    attempt: int,
    exc: BaseException,
    permanent_errors: tuple[type[BaseException], ...] = (),
    rng: random.Random | None = None,
) -> FailureDecision:
    """The verdict for attempt ``attempt`` (1-based) that raised ``exc``."""
    if isinstance(exc, PermanentError) or (permanent_errors and isinstance(exc, permanent_errors)):
        return FailureDecision(PERMANENT)
    if attempt >= policy.max_attempts:
        return FailureDecision(EXHAUSTED)
    return FailureDecision(RETRY, compute_backoff(policy, attempt, rng))


def delivery_ttl_seconds(policy: RetryPolicy, visibility_timeout_seconds: int) -> int:
    """How long a delivery count must live: the longest a job can stay in flight, plus an hour.

    Each attempt waits at most ``cap`` before it and can be held at most one visibility
    timeout by a worker that dies.
    """
    per_attempt = policy.cap.total_seconds() + visibility_timeout_seconds
    return int(policy.max_attempts * per_attempt) + 3600
