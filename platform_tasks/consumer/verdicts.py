"""The one value a delivery comes to, between deciding it and settling it.

:func:`~platform_tasks.consumer.pipeline.DeliveryPipeline.decide` returns exactly one of
these for every delivery and :meth:`~platform_tasks.consumer.pipeline.DeliveryPipeline.settle`
acts on it (store the retry, write the dead letter, count, alert, tell Celery), in the
way procrastinate's worker hands a ``RetryDecision`` from running a job to persisting its
status. By the time a verdict exists the job's transaction has ended: committed for
:class:`Applied`, rolled back for every other verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from platform_tasks.dead_letters.dead_letter import DeadLetter


@dataclass(frozen=True)
class Applied:
    """The handler ran and its work committed with the idempotency row."""

    attempt: int
    result: Any = None
    tracked: bool = False
    """The job had a delivery-count hash in Redis, to clear now."""


@dataclass(frozen=True)
class Duplicate:
    """Nothing to do: already applied (``reason="applied"``) or already dead-lettered."""

    reason: str
    dead_letter_id: int | None = None


@dataclass(frozen=True)
class RetryAt:
    """Attempt ``attempt`` failed with ``error``; run attempt ``attempt + 1`` at ``at``."""

    at: datetime
    attempt: int
    error: BaseException


@dataclass(frozen=True)
class ThrottledUntil:
    """The job may not run before ``at``: run the *same* attempt then (no attempt spent)."""

    at: datetime
    attempt: int
    reason: str


@dataclass(frozen=True)
class GaveUp:
    """The job will not run again: write ``record`` as its dead letter.

    Named for the outcome, like the other verdicts; settling it raises
    :class:`~platform_tasks.errors.DeadLettered`, which is what Celery sees. With
    ``claim`` the job is claimed again while the row is written.

    The claim keeps a concurrent copy of the job waiting, and finding the job applied or
    dead-lettered by such a copy meanwhile turns the verdict into :class:`Duplicate`.
    ``row`` is set when the row was already written while the delivery held its first
    claim (a failed handler: the copy waiting on that claim then finds it).
    """

    record: DeadLetter
    error: BaseException | None
    claim: bool = True
    row: int | None = None


@dataclass(frozen=True)
class Wait:
    """PostgreSQL or Redis is unavailable (or, ``outage`` false, a platform step failed
    for another reason): roll back, keep the message, start over later."""

    cause: str
    outage: bool = True
    """Whether the cause is an outage; else the wait is logged as the failure it is."""


Verdict = Applied | Duplicate | RetryAt | ThrottledUntil | GaveUp | Wait
"""Everything one delivery can come to."""
