"""An existing Django project that mounts the console in its admin (docs/console.md):
its own database as ``default`` (``HOST_DATABASE_URL``), the platform's as ``platform``
(``PLATFORM_DATABASE_URL``), and the console's router."""

from __future__ import annotations

import os
from urllib.parse import urlsplit


def _database(url: str) -> dict[str, str]:
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


DATABASES = {
    "default": _database(os.environ["HOST_DATABASE_URL"]),
    "platform": _database(os.environ["PLATFORM_DATABASE_URL"]),
}
DATABASE_ROUTERS = ["platform_tasks.contrib.django.routers.PlatformConsoleRouter"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "platform_tasks.contrib.django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "platform_tasks.contrib.django.login_throttle.LoginThrottleMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
PLATFORM_CONSOLE_LOGIN_FAILURES = 2
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "tests.apps.console_project.urls"
SECRET_KEY = "tests-only-not-secret"
ALLOWED_HOSTS = ["testserver"]
STATIC_URL = "/static/"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
