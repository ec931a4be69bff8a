"""Django settings for teams that run django-celery-beat without a Django project.

``DATABASES`` comes from ``PLATFORM_DATABASE_URL`` (the platform's own PostgreSQL), and
the only application is ``django_celery_beat``. Create its tables once::

    DJANGO_SETTINGS_MODULE=platform_tasks.contrib.django_settings python -m django migrate

``LeaseDatabaseScheduler`` uses this module when ``DJANGO_SETTINGS_MODULE`` is not set.
"""

from __future__ import annotations

import os
import secrets
from urllib.parse import unquote, urlsplit

from platform_tasks.errors import SettingsError


def _database_from_url(url: str | None) -> dict[str, object]:
    if not url:
        raise SettingsError([("PLATFORM_DATABASE_URL", "must be set for django-celery-beat")])
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.path.strip("/"):
        raise SettingsError(
            [("PLATFORM_DATABASE_URL", "must be postgresql://user[:password]@host[:port]/db")]
        )
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # beat reads the schedule every few seconds: keep the connection
        "CONN_MAX_AGE": None,
        "CONN_HEALTH_CHECKS": True,
    }


DATABASES = {"default": _database_from_url(os.environ.get("PLATFORM_DATABASE_URL"))}
INSTALLED_APPS = ["django_celery_beat"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
# Nothing here signs or keeps sessions; Django only needs the setting to exist.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(32)
