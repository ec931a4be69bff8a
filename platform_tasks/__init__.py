"""platform-tasks: a Celery extension that gives a multi-tenant product a job platform.

Public names are listed in ``__all__``; everything else is internal.
"""

from __future__ import annotations

from platform_tasks.app import PlatformCelery, create_app
from platform_tasks.envelope import Envelope
from platform_tasks.errors import PermanentError, PlatformError
from platform_tasks.queue_port import QueuePort
from platform_tasks.retry import RetryPolicy
from platform_tasks.settings import PlatformSettings
from platform_tasks.task import PlatformTask

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
