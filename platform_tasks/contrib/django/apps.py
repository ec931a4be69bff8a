"""The console's Django application config."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["PlatformConsoleConfig"]

APP_LABEL = "platform_console"
"""The app's label: permissions are ``platform_console.<codename>`` (``platform_tasks``'s
last component, ``django``, would clash with nothing but reads badly in permission names)."""


class PlatformConsoleConfig(AppConfig):
    name = "platform_tasks.contrib.django"
    label = APP_LABEL
    verbose_name = "Platform operations"
    default_auto_field = "django.db.models.BigAutoField"
