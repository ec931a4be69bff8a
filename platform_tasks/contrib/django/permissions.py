"""What each console permission allows, and the two groups ``console create-user`` fills.

Django's ``view_*`` permissions let a user look; acting needs one of the permissions
below on top. A user without them sees no action buttons, and a POST to an action
(a forged one included) is refused with 403 before anything runs.
"""

from __future__ import annotations

from typing import Any

from platform_tasks.contrib.django.apps import APP_LABEL

__all__ = [
    "CANCEL_JOBS",
    "DISCARD_DEAD_LETTERS",
    "GROUPS",
    "OPERATOR_PERMISSIONS",
    "PAUSE_QUEUES",
    "REPLAY_DEAD_LETTERS",
    "VIEWER_PERMISSIONS",
    "VIEW_PAYLOAD",
    "has",
]

VIEW_PAYLOAD = "view_dead_letter_payload"
"""See what a dead letter carries (customer data): its payload beyond the envelope's
metadata and its error text, and search that text. Without it a user sees the envelope's
identifiers and the error type."""
REPLAY_DEAD_LETTERS = "replay_dead_letters"
DISCARD_DEAD_LETTERS = "discard_dead_letters"
CANCEL_JOBS = "cancel_jobs"
PAUSE_QUEUES = "pause_queues"
"""Pause and resume a queue for every worker."""

VIEWER_PERMISSIONS = ("view_deadletter", "view_operation", "view_queue", "view_batch")
OPERATOR_PERMISSIONS = (
    *VIEWER_PERMISSIONS,
    VIEW_PAYLOAD,
    REPLAY_DEAD_LETTERS,
    DISCARD_DEAD_LETTERS,
    CANCEL_JOBS,
    PAUSE_QUEUES,
)

GROUPS = {
    "console viewers": VIEWER_PERMISSIONS,
    "console operators": OPERATOR_PERMISSIONS,
}
"""Groups ``platform-tasks console create-user --role`` puts users in (kept in step with
the codenames above each time the console starts)."""


def has(user: Any, codename: str) -> bool:
    """True when ``user`` holds ``platform_console.<codename>`` (superusers hold all)."""
    return bool(user.is_active and user.has_perm(f"{APP_LABEL}.{codename}"))
