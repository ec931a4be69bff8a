"""Settings of the standalone console (``platform-tasks console``), for teams without a
Django project.

Everything comes from the environment:

* ``PLATFORM_DATABASE_URL`` (required): the platform's PostgreSQL. The console reads and
  writes schema ``core`` by explicit names; its own Django tables (users, groups,
  permissions, sessions, content types, its migration records) go to schema
  ``PLATFORM_CONSOLE_SCHEMA`` (default ``console``) through the connection's
  ``search_path``, never to ``core`` or ``public``. ``platform-tasks console`` creates
  that schema and migrates it at start.
* ``PLATFORM_CONSOLE_SECRET_KEY``: signs sessions and CSRF tokens. Without it a random key
  is made at each start (everyone logs in again after a restart; the start logs a warning).
* ``PLATFORM_CONSOLE_ALLOWED_HOSTS``: comma-separated host names the console answers to
  (default the loopback names; ``platform-tasks console --host`` adds the bound address).
* ``PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS``: comma-separated origins (``https://ops.example``)
  when a TLS proxy sits in front; ``PLATFORM_CONSOLE_SECURE_COOKIES=1`` marks the session
  and CSRF cookies secure (set it behind HTTPS).
* ``PLATFORM_CONSOLE_BEHIND_TLS_PROXY=1`` (``--behind-tls-proxy``): a TLS-terminating proxy
  is in front; the cookies are then always secure
  (:mod:`platform_tasks.contrib.django.exposure`).
* ``PLATFORM_CONSOLE_LOGIN_FAILURES`` (5), ``PLATFORM_CONSOLE_LOGIN_FAILURES_PER_ADDRESS``
  (20), ``PLATFORM_CONSOLE_LOGIN_LOCKOUT_SECONDS`` (900): the login throttle
  (:mod:`platform_tasks.contrib.django.login_throttle`).
"""

from __future__ import annotations

import os
import secrets

from platform_tasks.contrib.django.exposure import (
    BEHIND_TLS_PROXY_ENV,
    SECURE_COOKIES_ENV,
    flag,
)
from platform_tasks.contrib.django.settings_values import (
    LOOPBACK_HOSTS,
    console_schema,
    database_from_url,
    positive_int,
)


def _list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


CONSOLE_SCHEMA = console_schema(os.environ.get("PLATFORM_CONSOLE_SCHEMA"))
DATABASES = {"default": database_from_url(os.environ.get("PLATFORM_DATABASE_URL"), CONSOLE_SCHEMA)}

SECRET_KEY_FROM_ENV = bool(os.environ.get("PLATFORM_CONSOLE_SECRET_KEY"))
SECRET_KEY = os.environ.get("PLATFORM_CONSOLE_SECRET_KEY") or secrets.token_urlsafe(50)
DEBUG = False
ALLOWED_HOSTS = _list("PLATFORM_CONSOLE_ALLOWED_HOSTS", LOOPBACK_HOSTS)
CSRF_TRUSTED_ORIGINS = _list("PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS", [])
_SECURE = bool(flag(os.environ, BEHIND_TLS_PROXY_ENV) or flag(os.environ, SECURE_COOKIES_ENV))
PLATFORM_CONSOLE_LOGIN_FAILURES = positive_int(
    "PLATFORM_CONSOLE_LOGIN_FAILURES", os.environ.get("PLATFORM_CONSOLE_LOGIN_FAILURES"), 5
)
PLATFORM_CONSOLE_LOGIN_FAILURES_PER_ADDRESS = positive_int(
    "PLATFORM_CONSOLE_LOGIN_FAILURES_PER_ADDRESS",
    os.environ.get("PLATFORM_CONSOLE_LOGIN_FAILURES_PER_ADDRESS"),
    20,
)
PLATFORM_CONSOLE_LOGIN_LOCKOUT_SECONDS = positive_int(
    "PLATFORM_CONSOLE_LOGIN_LOCKOUT_SECONDS",
    os.environ.get("PLATFORM_CONSOLE_LOGIN_LOCKOUT_SECONDS"),
    900,
)
SESSION_COOKIE_SECURE = _SECURE
CSRF_COOKIE_SECURE = _SECURE
SESSION_COOKIE_NAME = "platform_console_session"
CSRF_COOKIE_NAME = "platform_console_csrftoken"
SESSION_COOKIE_AGE = 8 * 3600
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"

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
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "platform_tasks.contrib.django.login_throttle.LoginThrottleMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "platform_tasks.contrib.django.urls"
WSGI_APPLICATION = "platform_tasks.contrib.django.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
# The admin's CSS and JS, served by WhiteNoise from the installed apps (no collectstatic).
STATIC_URL = "/static/"
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = False

USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "admin:login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "event": {"()": "platform_tasks.contrib.django.log_events.EventFilter"},
        "refusals": {"()": "platform_tasks.contrib.django.log_events.RoutineRefusals"},
    },
    "formatters": {
        "line": {"format": "%(asctime)s %(levelname)s %(name)s event=%(event)s %(message)s"}
    },
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "filters": ["event", "refusals"],
            "formatter": "line",
        }
    },
    "root": {"handlers": ["stderr"], "level": "INFO"},
}
