"""A Django project whose default database holds the platform's schema ``core``: its
views publish jobs inside ``transaction.atomic`` (``platform_tasks.contrib.django_outbox``)."""

from __future__ import annotations

import os

from platform_tasks.contrib.django_database import database_from_url

DATABASES = {
    "default": database_from_url(
        os.environ["PLATFORM_DATABASE_URL"], needed_by="the outbox tests", conn_max_age=0
    )
}
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "tests.apps.outbox_django.urls"
SECRET_KEY = "tests-only-not-secret"
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
