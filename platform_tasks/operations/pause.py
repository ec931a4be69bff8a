"""Pause and resume a queue across every worker, at runtime.

A pause is a flag in the platform's Redis (one hash field per queue: the operation id,
who, since when) plus a ``core.operations`` row. Every worker runs
:class:`~platform_tasks.operations.worker.QueuePauseStep`, which reads the flags every
:data:`POLL_SECONDS` and cancels its consumer of a paused queue (the same call as Celery's
``cancel_consumer`` and the marketing yield), adding it back on resume. Jobs already
fetched finish; nothing is requeued. A pause outlives worker restarts until resumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg2.extensions import connection as Connection

from platform_tasks.operations.log import Operation
from platform_tasks.settings import PlatformSettings

__all__ = [
    "POLL_SECONDS",
    "PausedQueue",
    "QueueStatus",
    "pause_queue",
    "paused_queues",
    "queue_overview",
    "resume_queue",
]

POLL_SECONDS = 0.25
"""How often a worker reads the pause flags: a pause is honoured within about this long
(plus the event loop's turn), well inside a second."""


@dataclass(frozen=True)
class PausedQueue:
    queue: str
    operation_id: int
    actor: str
    since: datetime


@dataclass(frozen=True)
class QueueStatus:
    """One queue for a listing: its depth on the broker (``None`` when unreadable) and
    its pause, if any."""

    queue: str
    depth: int | None
    paused: PausedQueue | None


def pause_queue(
    settings: PlatformSettings, queue: str, *, actor: str | None = None,
    conn: Connection | None = None,
) -> Operation:  # fmt: skip
    """Pause ``queue`` on every worker; recorded as a ``pause`` operation. Pausing a
    paused queue is recorded too and keeps the first pause's time. Needs
    ``settings.database_url`` and ``settings.redis_url``."""
    raise NotImplementedError


def resume_queue(
    settings: PlatformSettings, queue: str, *, actor: str | None = None,
    conn: Connection | None = None,
) -> Operation:  # fmt: skip
    """Resume ``queue`` on every worker that consumes it; a ``resume`` operation
    (``outcome='succeeded'``, or ``detail`` says it was not paused)."""
    raise NotImplementedError


def paused_queues(settings: PlatformSettings) -> list[PausedQueue]:
    """Every paused queue, by name. Needs ``settings.redis_url``."""
    raise NotImplementedError


def queue_overview(
    settings: PlatformSettings, queues: Sequence[str] | None = None, *, app: Any | None = None
) -> list[QueueStatus]:
    """Depth and pause of ``queues`` (default: the app's queues when ``app`` is given,
    plus every paused queue, plus ``default``). Depths are asked of the broker."""
    raise NotImplementedError
