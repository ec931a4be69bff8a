"""Values of the standalone settings, computed without importing Django or reading the
environment (so ``platform-tasks console`` can use them before Django is set up): the
console's schema, its database entry, the host names it answers to."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from platform_tasks.errors import SettingsError

__all__ = ["LOOPBACK_HOSTS", "console_schema", "database_from_url", "with_host"]

LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]", "::1"]


def with_host(host: str) -> list[str]:
    """The loopback names plus ``host`` (an IPv6 address also in brackets)."""
    names = list(LOOPBACK_HOSTS)
    bare = host.strip("[]")
    for name in (bare, f"[{bare}]" if ":" in bare else bare):
        if name not in names:
            names.append(name)
    return names


_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def console_schema(value: str | None) -> str:
    """The schema of the console's own tables; refuses ``core`` and non-identifiers."""
    schema = (value or "console").strip()
    if not _SCHEMA.match(schema) or schema in ("core", "pg_catalog", "information_schema"):
        raise SettingsError(
            [
                (
                    "PLATFORM_CONSOLE_SCHEMA",
                    f"must be a lower-case identifier other than core (got {schema!r})",
                )
            ]
        )
    return schema


def database_from_url(url: str | None, schema: str) -> dict[str, object]:
    """Django's ``DATABASES`` entry for the platform database, its tables in ``schema``."""
    if not url:
        raise SettingsError([("PLATFORM_DATABASE_URL", "must be set for the console")])
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
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {
            "options": f"-c search_path={schema}",
            "application_name": "platform-tasks console",
        },
    }
