"""Retry policy and its decision: how many attempts a job gets, how long it waits between.

The policy is a value object, :func:`compute_backoff` a pure function of the attempt
number and a random source, and :func:`decide` a pure function of policy, attempt and
error returning a :class:`RetryDecision` (procrastinate's ``RetryDecision``), free of
Celery, Redis and PostgreSQL so the rules can be tested exhaustively: a job runs at most
``policy.max_attempts`` times whatever Celery's own ``max_retries`` says,
:class:`~platform_tasks.errors.PermanentError` and the task's ``permanent_errors`` never
retry, and every retry waits the jittered backoff.

Backoff formula (documented in the README): before attempt ``n + 1`` (``n >= 1`` attempts
made so far) the nominal delay is ``d = min(cap, base * 2**(n - 1))`` and the actual delay
is drawn uniformly from ``[d/2, d]``. It is never zero, so a failing job never retries
immediately, and jitter spreads a burst of failures over half the window.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from platform_tasks.errors import ConfigurationError, PermanentError

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BASE = timedelta(seconds=30)
DEFAULT_CAP = timedelta(hours=1)


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts and backoff for one queue; anything but the default needs a ``rationale``.

    Requiring a written reason keeps per-queue exceptions rare and reviewable.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    base: timedelta = DEFAULT_BASE
    cap: timedelta = DEFAULT_CAP
    rationale: str | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(
                f"RetryPolicy.max_attempts must be at least 1, got {self.max_attempts}"
            )
        if self.base <= timedelta(0):
            raise ConfigurationError("RetryPolicy.base must be a positive timedelta")
        if self.cap < self.base:
            raise ConfigurationError("RetryPolicy.cap must not be smaller than RetryPolicy.base")

    @property
    def is_default(self) -> bool:
        return (self.max_attempts, self.base, self.cap) == (
            DEFAULT_MAX_ATTEMPTS,
            DEFAULT_BASE,
            DEFAULT_CAP,
        )

    def check_rationale(self, queue: str) -> None:
        """A non-default policy without a rationale is a start-up error naming the queue."""
        if not self.is_default and not (self.rationale and self.rationale.strip()):
            raise ConfigurationError(
                f"retry_policies[{queue!r}]: a RetryPolicy other than the default must carry "
                "a rationale (RetryPolicy(..., rationale='why this queue differs'))"
            )

    def nominal_delay(self, attempts_made: int) -> timedelta:
        """``min(cap, base * 2**(attempts_made - 1))``: the upper bound of the next wait."""
        if attempts_made < 1:
            raise ValueError("attempts_made starts at 1 (the first attempt)")
        exponent = min(attempts_made - 1, 62)
        seconds = min(self.cap.total_seconds(), self.base.total_seconds() * (2**exponent))
        return timedelta(seconds=seconds)


DEFAULT_POLICY = RetryPolicy()
"""The policy of every queue without one of its own (immutable, so shared)."""


def compute_backoff(
    policy: RetryPolicy, attempts_made: int, rng: random.Random | None = None
) -> timedelta:
    """Jittered delay before the next attempt: uniform in ``[d/2, d]``."""
    nominal = policy.nominal_delay(attempts_made).total_seconds()
    draw = (rng or random).uniform(nominal / 2, nominal)
    return timedelta(seconds=draw)


def resolve_policies(
    policies: dict[str, RetryPolicy] | None,
) -> dict[str, RetryPolicy]:
    """Validate the ``retry_policies`` given to ``create_app``: types and rationales."""
    resolved: dict[str, RetryPolicy] = {}
    for queue, policy in (policies or {}).items():
        if not isinstance(policy, RetryPolicy):
            raise ConfigurationError(
                f"retry_policies[{queue!r}] must be a RetryPolicy, got {type(policy).__name__}"
            )
        policy.check_rationale(queue)
        resolved[queue] = policy
    return resolved


RETRY: Final = "retry"
PERMANENT: Final = "permanent_error"
EXHAUSTED: Final = "retries_exhausted"
CRASH_LOOP: Final = "crash_loop"
POISON: Final = "poison"
"""Dead-letter reasons the pipeline writes (``RETRY`` is the one decision that is not)."""


@dataclass(frozen=True)
class RetryDecision:
    """Retry after ``delay``, or dead-letter with ``reason`` (``delay`` is then ``None``)."""

    reason: str
    delay: timedelta | None = None

    @property
    def retry(self) -> bool:
        return self.reason == RETRY


def decide(
    policy: RetryPolicy,
    attempt: int,
    exc: BaseException,
    permanent_errors: tuple[type[BaseException], ...] = (),
    rng: random.Random | None = None,
) -> RetryDecision:
    """The decision for attempt ``attempt`` (1-based) that failed with ``exc``."""
    if isinstance(exc, PermanentError) or (permanent_errors and isinstance(exc, permanent_errors)):
        return RetryDecision(PERMANENT)
    if attempt >= policy.max_attempts:
        return RetryDecision(EXHAUSTED)
    return RetryDecision(RETRY, compute_backoff(policy, attempt, rng))
