"""Django's ``DATABASES`` entry for the platform's PostgreSQL, from PLATFORM_DATABASE_URL.

Both Django settings the platform ships (django-celery-beat's and the console's) point
Django at the database the rest of the platform uses; one reading of the URL keeps their
errors (naming the setting, never echoing the URL) and their quoting rules the same.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from platform_tasks.errors import SettingsError

__all__ = ["database_from_url"]


def database_from_url(
    url: str | None, *, needed_by: str, conn_max_age: int | None
) -> dict[str, object]:
    """The ``DATABASES`` entry for ``url``; ``SettingsError`` naming the setting when it is
    missing or not a PostgreSQL URL. ``needed_by`` says who needs it in the error."""
    if not url:
        raise SettingsError([("PLATFORM_DATABASE_URL", f"must be set for {needed_by}")])
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
        "CONN_MAX_AGE": conn_max_age,
        "CONN_HEALTH_CHECKS": True,
    }
