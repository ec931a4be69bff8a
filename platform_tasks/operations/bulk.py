"""Bulk replay and discard of every pending dead letter matching a filter.

One operation is one ``core.operations`` row. It walks the matching pending rows in id
order, ``batch_size`` per transaction: lock the batch with ``FOR UPDATE SKIP LOCKED``,
publish (replay) or mark (discard) each row, mark them, add the batch to the operation's
counts and move its ``last_id`` — all in that one transaction. So:

- two operations running the same filter at once never act on the same row: a row the
  other holds is skipped, a row it committed is no longer pending;
- a crash loses at most the batch in flight (rolled back; for a replay its publishes
  may have happened, and the consumer's idempotency row makes the republish harmless);
- rerunning the same kind and filter finds the unfinished (``running``) operation and
  continues it from ``last_id`` instead of starting a new one.

Memory holds one batch whatever the number of rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg2.extensions import connection as Connection

from platform_tasks.dead_letters import DeadLetter, Publish
from platform_tasks.operations.filters import OperationFilter
from platform_tasks.operations.log import Operation
from platform_tasks.settings import PlatformSettings

__all__ = [
    "BULK_BATCH_SIZE",
    "BulkResult",
    "Preview",
    "bulk_discard",
    "bulk_replay",
    "preview_dead_letters",
]

BULK_BATCH_SIZE = 500
"""Rows locked, acted on and committed per transaction."""


@dataclass(frozen=True)
class Preview:
    """What a bulk action would act on now: the count of matching pending rows, how many
    of them a replay would refuse (no readable envelope), and the first ``sample`` rows
    (payload left out, ``last_error`` cut to its start)."""

    matched: int
    sample: list[DeadLetter]


@dataclass(frozen=True)
class BulkResult:
    """The finished (or, on error, last committed) state of one bulk operation."""

    operation: Operation
    resumed: bool
    """True when this run continued an unfinished operation of the same kind and filter."""
    refused: list[tuple[int, str]]
    """``(id, why)`` of rows this run left pending because they cannot be replayed
    (at most :data:`REFUSED_KEPT`; the operation's ``failed`` count has them all)."""


def preview_dead_letters(
    settings: PlatformSettings,
    where: OperationFilter,
    *,
    sample_size: int = 20,
    conn: Connection | None = None,
) -> Preview:
    """Count the pending rows matching ``where`` and return the oldest ``sample_size``.

    Nothing is locked or changed; the ``--dry-run`` of the CLI and the console's
    confirmation page show this. Needs ``settings.database_url``.
    """
    raise NotImplementedError


def bulk_replay(
    settings: PlatformSettings,
    where: OperationFilter,
    *,
    actor: str | None = None,
    app: Any | None = None,
    publish: Publish | None = None,
    open_publish: Callable[[], Publish] | None = None,
    batch_size: int = BULK_BATCH_SIZE,
    allow_empty_filter: bool = False,
    conn: Connection | None = None,
    now: datetime | None = None,
) -> BulkResult:
    """Republish every pending dead letter matching ``where`` to its original queue, with
    its original job id, and mark it ``replayed``; one recorded operation.

    Publishing uses, in order of preference: ``publish`` (a callable ``(queue, envelope)``),
    ``open_publish`` (called once, at the first row to publish), ``app`` (a platform
    Celery app: ``QueuePort(app).publish``, for custom routing), else a port built from
    ``settings`` alone (broker, delay store), like ``platform-tasks dead-letters replay``.
    Rows without a readable envelope stay pending and are counted as ``failed``.

    An empty filter means every pending row and is refused unless ``allow_empty_filter``.
    ``actor`` defaults to :func:`~platform_tasks.operations.log.default_actor`. If an
    unfinished replay with the same filter exists it is continued (``resumed=True``).
    A publish that fails ends the operation as ``failed`` after committing what was
    published before it, then raises :class:`~platform_tasks.errors.ReplayError`.
    Needs ``settings.database_url`` and the broker settings.
    """
    raise NotImplementedError


def bulk_discard(
    settings: PlatformSettings,
    where: OperationFilter,
    *,
    reason: str,
    actor: str | None = None,
    batch_size: int = BULK_BATCH_SIZE,
    allow_empty_filter: bool = False,
    conn: Connection | None = None,
    now: datetime | None = None,
) -> BulkResult:
    """Mark every pending dead letter matching ``where`` ``discarded`` with ``reason``
    (stored as ``discard_reason``, suffixed with the operation id); one recorded
    operation, batched, concurrent-safe and resumable like :func:`bulk_replay`.
    Needs ``settings.database_url`` only.
    """
    raise NotImplementedError
