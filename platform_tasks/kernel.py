"""The app's class: a Celery app that carries its platform settings and retry policies.

It lives apart from the composition root (``app.py``, which builds the app and lists every
concern's installer) so that a module which needs the app's type imports this small module
and nothing else: no stage has to import the root, and the root stays the one module that
names every installer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery import Celery

from platform_tasks.app_state import close_process_state

if TYPE_CHECKING:
    from platform_tasks.consumer.retry import RetryPolicy
    from platform_tasks.settings import PlatformSettings

__all__ = ["PlatformCelery"]


class PlatformCelery(Celery):
    """A Celery app that carries its platform settings and retry policies explicitly.

    Collaborators read settings from here instead of ambient ``app.conf`` lookups.
    Task events go through the platform's batching dispatcher (``event_batching``).
    """

    events_cls = "platform_tasks.observability.event_batching:PlatformEvents"

    platform_settings: PlatformSettings
    retry_policies: dict[str, RetryPolicy]
    default_retry_policy: RetryPolicy
    """The policy of a queue ``retry_policies`` does not name (set by ``create_app``)."""

    def retry_policy_for(self, queue: str | None) -> RetryPolicy:
        return self.retry_policies.get(queue or "", self.default_retry_policy)

    def close(self) -> None:
        """Celery's close (the broker connection pools), then the connections this
        process keeps open for the app between jobs (its consumer, email providers and
        limits: each :class:`~platform_tasks.app_state.ProcessState`)."""
        super().close()
        close_process_state(self)
