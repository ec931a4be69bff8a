"""platform-tasks: a Celery extension that gives a multi-tenant product a job platform.

Public names are listed in ``__all__``; everything else is internal.

The names are imported on first access (PEP 562): ``import platform_tasks`` alone loads
neither Celery nor the Redis and PostgreSQL drivers, so tools that need none of them
(``platform-tasks jobs docs``, the static reader) start quickly and run without them.
``from platform_tasks import create_app`` works as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platform_tasks.lazy import lazy_exports

if TYPE_CHECKING:
    from platform_tasks.app import create_app
    from platform_tasks.consumer.retry import RetryPolicy
    from platform_tasks.consumer.task import PlatformTask
    from platform_tasks.envelope import Envelope
    from platform_tasks.errors import PermanentError, PlatformError
    from platform_tasks.kernel import PlatformCelery
    from platform_tasks.publishing.queue_port import QueuePort
    from platform_tasks.settings import PlatformSettings

__all__ = [
    "Envelope",
    "PermanentError",
    "PlatformCelery",
    "PlatformError",
    "PlatformSettings",
    "PlatformTask",
    "QueuePort",
    "RetryPolicy",
    "create_app",
]

_HOMES: dict[str, str] = {
    "Envelope": "platform_tasks.envelope",
    "PermanentError": "platform_tasks.errors",
    "PlatformCelery": "platform_tasks.kernel",
    "PlatformError": "platform_tasks.errors",
    "PlatformSettings": "platform_tasks.settings",
    "PlatformTask": "platform_tasks.consumer.task",
    "QueuePort": "platform_tasks.publishing.queue_port",
    "RetryPolicy": "platform_tasks.consumer.retry",
    "create_app": "platform_tasks.app",
}
"""Where each public name lives; the module is imported when the name is first used."""


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
