"""Compatibility import: :class:`PlatformTask` lives in :mod:`platform_tasks.consumer.task`.

Kept because ``from platform_tasks.task import PlatformTask`` appears in existing code;
new code imports ``platform_tasks.PlatformTask``.
"""

from __future__ import annotations

from platform_tasks.consumer.task import PlatformTask

__all__ = ["PlatformTask"]
