"""Django settings for teams that run django-celery-beat without a Django project.

``DATABASES`` comes from ``PLATFORM_DATABASE_URL`` (the platform's own PostgreSQL), and
the only application is ``django_celery_beat``. Create its tables once::

    DJANGO_SETTINGS_MODULE=platform_tasks.contrib.django_settings python -m django migrate

``LeaseDatabaseScheduler`` uses this module when ``DJANGO_SETTINGS_MODULE`` is not set.
"""

from __future__ import annotations

import os
import secrets

from platform_tasks.contrib.django_database import database_from_url

# beat reads the schedule every few seconds: keep the connection (CONN_MAX_AGE None)
DATABASES = {
    "default": database_from_url(
        os.environ.get("PLATFORM_DATABASE_URL"), needed_by="django-celery-beat", conn_max_age=None
    )
}
INSTALLED_APPS = ["django_celery_beat"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
# Nothing here signs or keeps sessions; Django only needs the setting to exist.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(32)
