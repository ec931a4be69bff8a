"""Operator actions over many jobs at once, each recorded in ``core.operations``.

The library behind ``platform-tasks dead-letters replay|discard`` (by filter),
``platform-tasks jobs cancel``, ``platform-tasks queues pause|resume|list`` and
``platform-tasks operations list``, and behind the operations console. Every function
takes the :class:`~platform_tasks.settings.PlatformSettings` it needs (database, Redis,
broker) and opens its own connections unless given one.
"""

from __future__ import annotations

from platform_tasks.operations.bulk import (
    BULK_BATCH_SIZE,
    BulkResult,
    Preview,
    bulk_discard,
    bulk_replay,
    preview_dead_letters,
)
from platform_tasks.operations.cancel import (
    DEFAULT_RULE_TTL,
    CancelPreview,
    CancelResult,
    CancelRule,
    cancel_jobs,
    cancel_rules,
    is_cancelled,
    lift_cancel,
    preview_cancel,
)
from platform_tasks.operations.filters import JobFilter, OperationFilter
from platform_tasks.operations.log import (
    Operation,
    default_actor,
    get_operation,
    list_operations,
)
from platform_tasks.operations.pause import (
    POLL_SECONDS,
    PausedQueue,
    QueueStatus,
    pause_queue,
    paused_queues,
    queue_overview,
    resume_queue,
)

__all__ = [
    "BULK_BATCH_SIZE",
    "DEFAULT_RULE_TTL",
    "POLL_SECONDS",
    "BulkResult",
    "CancelPreview",
    "CancelResult",
    "CancelRule",
    "JobFilter",
    "Operation",
    "OperationFilter",
    "PausedQueue",
    "Preview",
    "QueueStatus",
    "bulk_discard",
    "bulk_replay",
    "cancel_jobs",
    "cancel_rules",
    "default_actor",
    "get_operation",
    "is_cancelled",
    "lift_cancel",
    "list_operations",
    "pause_queue",
    "paused_queues",
    "preview_cancel",
    "preview_dead_letters",
    "queue_overview",
    "resume_queue",
]
