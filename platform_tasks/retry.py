"""Retry policy: how many attempts a job gets and how long it waits between them.

The policy is a value object and :func:`compute_backoff` a pure function of the attempt
number and a random source, so the jitter bounds can be tested exhaustively.

Backoff formula (documented in the README): before attempt ``n + 1`` (``n >= 1`` attempts
made so far) the nominal delay is ``d = min(cap, base * 2**(n - 1))`` and the actual delay
is drawn uniformly from ``[d/2, d]``. It is never zero, so a failing job never retries
immediately, and jitter spreads a burst of failures over half the window.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from platform_tasks.errors import ConfigurationError

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
