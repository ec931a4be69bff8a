"""Cancel waiting jobs by tenant, kind and queue, accounting for every one.

A cancel is one ``core.operations`` row (kind ``cancel``) and does two things:

1. **A cancel rule** in the platform's Redis (the filter, the operation id, a cutoff and
   an expiry). Every consumer checks the rules before running a job
   (:func:`platform_tasks.operations.consumer_check.cancelled_by`): a job that matches
   and was published at or before the cutoff (its uuid7 job id's time) is not run; a
   ``core.dead_letters`` row records it (status ``discarded``, reason ``cancelled``,
   ``discard_reason`` ``cancelled by operation N``) in the same transaction as the job's
   idempotency row, so a redelivery of it is a duplicate. This is how queued jobs are
   cancelled on any broker (Redis lists or RabbitMQ queues): as they come up.
2. **A sweep of the delay store**: matching delayed jobs (and retries waiting there) are
   recorded the same way and removed from the store at once.

One accounting row per job (a unique index), whichever path reaches it first. A job
already running when the cancel is made sees :func:`is_cancelled` turn true and may stop
cooperatively. Jobs published after the cancel are not affected.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg2.extensions import connection as Connection

from platform_tasks.operations.filters import JobFilter
from platform_tasks.operations.log import Operation
from platform_tasks.settings import PlatformSettings

__all__ = [
    "DEFAULT_RULE_TTL",
    "CancelPreview",
    "CancelResult",
    "CancelRule",
    "cancel_jobs",
    "cancel_rules",
    "is_cancelled",
    "lift_cancel",
    "preview_cancel",
]

DEFAULT_RULE_TTL = timedelta(days=1)
"""How long a cancel rule keeps cancelling queued jobs as they come up."""


@dataclass(frozen=True)
class CancelRule:
    """A cancel in force: jobs matching ``filter`` published at or before ``cutoff``
    are not run until ``expires_at``."""

    operation_id: int
    filter: JobFilter
    cutoff: datetime
    expires_at: datetime


@dataclass(frozen=True)
class CancelPreview:
    """What a cancel would reach now: matching entries of the delay store, and the depth
    of the queues whose waiting jobs the rule would check (``None``: unreadable)."""

    delayed: int
    queue_depths: dict[str, int | None]


@dataclass(frozen=True)
class CancelResult:
    operation: Operation
    delayed_cancelled: int
    rule: CancelRule


def preview_cancel(settings: PlatformSettings, where: JobFilter, *,
                   queues: list[str] | None = None) -> CancelPreview:  # fmt: skip
    """Count matching delay-store entries (a scan; nothing changes) and read the depth of
    ``queues`` (default: ``where.queue`` if set, else none). Needs the broker settings
    (and the platform Redis for a RabbitMQ delay store)."""
    raise NotImplementedError


def cancel_jobs(
    settings: PlatformSettings,
    where: JobFilter,
    *,
    actor: str | None = None,
    rule_ttl: timedelta = DEFAULT_RULE_TTL,
    conn: Connection | None = None,
    now: datetime | None = None,
) -> CancelResult:
    """Cancel every waiting job matching ``where``: record the operation, set the rule
    (consumers stop running matching queued jobs), sweep the delay store.

    The operation's ``done`` counts every job accounted for so far; queued jobs are
    added as consumers reach them. Rerunning a cancel is harmless (each job has one row).
    Needs ``settings.database_url``, ``settings.redis_url`` and the broker settings.
    """
    raise NotImplementedError


def cancel_rules(settings: PlatformSettings) -> list[CancelRule]:
    """The cancel rules in force (expired ones are left out). Needs ``settings.redis_url``."""
    raise NotImplementedError


def lift_cancel(settings: PlatformSettings, operation_id: int) -> bool:
    """Remove the rule of cancel ``operation_id`` before it expires; jobs already cancelled
    stay cancelled. ``False`` when no such rule was in force."""
    raise NotImplementedError


def is_cancelled() -> bool:
    """Inside a running job: whether a cancel made after it started now matches it.

    Cooperative: a long handler calls this between units of work and stops (raising or
    returning) when true. Outside a job it is ``False``. Reads the rules at most every
    half second.
    """
    raise NotImplementedError
