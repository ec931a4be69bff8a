"""Database routing for a Django project that mounts the console in its own admin.

The project's ``default`` database usually is not the platform's. Name the platform's
database in ``DATABASES`` (alias ``platform`` unless ``PLATFORM_CONSOLE_DATABASE`` says
otherwise) and add this router::

    DATABASES = {"default": {...}, "platform": {... the platform's PostgreSQL ...}}
    DATABASE_ROUTERS = ["platform_tasks.contrib.django.routers.PlatformConsoleRouter"]

The console's models over schema ``core`` are then read and written there; every other
app (auth, sessions, content types, permissions) and the console's login-throttle table
stay where they were. No app is
ever migrated into the platform database (even ``migrate --database platform`` leaves
only Django's own bookkeeping table ``django_migrations`` there): its schema belongs to
``platform-tasks migrate``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from platform_tasks.contrib.django.apps import APP_LABEL

__all__ = ["PlatformConsoleRouter", "platform_alias"]


def platform_alias() -> str:
    """The ``DATABASES`` alias holding schema ``core``."""
    configured = getattr(settings, "PLATFORM_CONSOLE_DATABASE", None)
    if configured:
        return str(configured)
    return "platform" if "platform" in settings.DATABASES else "default"


def _over_core(model: Any) -> bool:
    """The console's unmanaged models read schema ``core``; its one managed model (the
    login throttle's counts) stays with the project's auth tables."""
    return bool(model._meta.app_label == APP_LABEL and not model._meta.managed)


class PlatformConsoleRouter:
    """Console models to the platform database; no Django migration ever runs there."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return platform_alias() if _over_core(model) else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return platform_alias() if _over_core(model) else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        alias = platform_alias()
        if alias != "default" and db == alias:
            return False  # the platform database's schema is the platform's own
        return None
