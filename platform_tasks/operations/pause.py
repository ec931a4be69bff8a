"""Pause and resume a queue across every worker, at runtime.

A pause is a flag in the platform's Redis (one hash field per queue: the operation id,
who, since when) plus a ``core.operations`` row. Every worker runs
:class:`~platform_tasks.consumer.queue_pause.QueuePauseStep`, which reads the flags every
:data:`POLL_SECONDS` and cancels its consumer of a paused queue (the same call as Celery's
``cancel_consumer`` and the marketing yield), adding it back on resume. Jobs already
fetched finish; nothing is requeued. A pause outlives worker restarts until resumed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from psycopg2.extensions import connection as Connection

from platform_tasks.consumer.queue_pause import POLL_SECONDS, PausedQueue, read_paused
from platform_tasks.keys import operation_keys
from platform_tasks.operations.log import (
    Operation,
    connect,
    default_actor,
    finish_operation,
    start_operation,
)
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "POLL_SECONDS",
    "PausedQueue",
    "QueueStatus",
    "broker_depths",
    "pause_queue",
    "paused_queues",
    "queue_overview",
    "read_paused",
    "resume_queue",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueStatus:
    """One queue for a listing: its depth on the broker (``None`` when unreadable) and
    its pause, if any."""

    queue: str
    depth: int | None
    paused: PausedQueue | None


def _redis(settings: PlatformSettings) -> Any:
    from platform_tasks.brokers.redis_client import build_redis

    return build_redis(settings)


def _check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not queue.strip():
        raise ValueError(f"queue must be a non-empty name, got {queue!r}")
    return queue


def _flag_operation(
    settings: PlatformSettings,
    kind: str,
    queue: str,
    actor: str,
    conn: Connection | None,
    act: Callable[[Any, int], bool],
    unchanged: str,
) -> tuple[Operation, bool]:
    """Record a ``pause``/``resume`` operation around ``act(client, operation_id)``.

    The row commits (``running``) before the flag changes, and is finished after it: a
    flag never changes without its row, and a failure to reach Redis leaves a ``failed``
    row, not a logged pause that never was. ``act`` says whether it changed the flag;
    ``unchanged`` is the detail when it did not."""
    client = _redis(settings)
    try:
        with connect(settings, conn) as db:
            with db, db.cursor() as cur:
                operation = start_operation(
                    cur, kind=kind, actor=actor, filter={"queue": queue}, matched=1
                )
            try:
                changed = act(client, operation.id)
            except BaseException as exc:
                db.rollback()
                with db, db.cursor() as cur:
                    finish_operation(
                        cur, operation.id, outcome="failed", detail=f"{type(exc).__name__}: {exc}"
                    )
                raise
            with db, db.cursor() as cur:
                cur.execute(
                    "UPDATE core.operations SET done = %s WHERE id = %s",
                    (1 if changed else 0, operation.id),
                )
                operation = finish_operation(
                    cur, operation.id, outcome="succeeded", detail=None if changed else unchanged
                )
    finally:
        client.close()
    return operation, changed


def pause_queue(
    settings: PlatformSettings,
    queue: str,
    *,
    actor: str | None = None,
    conn: Connection | None = None,
) -> Operation:
    """Pause ``queue`` on every worker; recorded as a ``pause`` operation. Pausing a
    paused queue is recorded too and keeps the first pause's time. Needs
    ``settings.database_url`` and ``settings.redis_url``."""
    _check_queue(queue)
    who = actor or default_actor()

    def set_flag(client: Any, operation_id: int) -> bool:
        flag = json.dumps(
            {"operation_id": operation_id, "actor": who, "since": datetime.now(UTC).isoformat()}
        )
        return bool(client.hsetnx(operation_keys(settings.profile).paused, queue, flag))

    operation, first = _flag_operation(
        settings, "pause", queue, who, conn, set_flag, "already paused"
    )
    logger.info(
        "queue %s paused by %s (operation %s)%s",
        queue,
        who,
        operation.id,
        "" if first else ": it already was",
        extra={
            "event": "operations.queue_paused",
            "queue": queue,
            "actor": who,
            "operation_id": operation.id,
            "already": not first,
        },
    )
    return operation


def resume_queue(
    settings: PlatformSettings,
    queue: str,
    *,
    actor: str | None = None,
    conn: Connection | None = None,
) -> Operation:
    """Resume ``queue`` on every worker that consumes it; a ``resume`` operation
    (``done=1``, or ``done=0`` and ``detail`` saying it was not paused)."""
    _check_queue(queue)
    who = actor or default_actor()

    def clear_flag(client: Any, operation_id: int) -> bool:
        return bool(client.hdel(operation_keys(settings.profile).paused, queue))

    operation, removed = _flag_operation(
        settings, "resume", queue, who, conn, clear_flag, "was not paused"
    )
    logger.info(
        "queue %s resumed by %s (operation %s)%s",
        queue,
        who,
        operation.id,
        "" if removed else ": it was not paused",
        extra={
            "event": "operations.queue_resumed",
            "queue": queue,
            "actor": who,
            "operation_id": operation.id,
            "was_paused": removed,
        },
    )
    return operation


def paused_queues(settings: PlatformSettings) -> list[PausedQueue]:
    """Every paused queue, by name. Needs ``settings.redis_url``."""
    client = _redis(settings)
    try:
        return sorted(read_paused(client, settings.profile).values(), key=lambda p: p.queue)
    finally:
        client.close()


def broker_depths(
    settings: PlatformSettings, queues: Sequence[str], *, app: PlatformCelery | None = None
) -> dict[str, int | None]:
    """Messages waiting in each of ``queues``, asked of the broker (``None`` when the
    broker cannot be read). ``app`` (default: one built from ``settings``) gives the
    connection, so the transport is the workers'."""
    from platform_tasks.notifications.yield_reader import ONE_ATTEMPT, broker_depth

    if app is None:
        from platform_tasks.app import PLATFORM_APP_NAME, create_app

        app = create_app(PLATFORM_APP_NAME, settings=settings)
    depths: dict[str, int | None] = {}
    try:
        with app.connection_for_read(transport_options=ONE_ATTEMPT) as connection:
            channel = connection.default_channel
            for queue in queues:
                depths[queue] = broker_depth(channel, queue)
    except Exception as exc:
        logger.warning(
            "queue depths unreadable: %s",
            type(exc).__name__,
            extra={"event": "operations.depths_unreadable"},
        )
        return dict.fromkeys(queues)
    return depths


def queue_overview(
    settings: PlatformSettings,
    queues: Sequence[str] | None = None,
    *,
    app: PlatformCelery | None = None,
) -> list[QueueStatus]:
    """Depth and pause of ``queues`` (default: the app's queues when ``app`` is given,
    plus every paused queue, plus ``default``). Depths are asked of the broker."""
    paused = {p.queue: p for p in paused_queues(settings)}
    if queues is None:
        names = set(paused) | {"default"}
        if app is not None:
            names |= set(app.amqp.queues)
        queues = sorted(names)
    depths = broker_depths(settings, queues, app=app)
    return [QueueStatus(name, depths.get(name), paused.get(name)) for name in queues]
