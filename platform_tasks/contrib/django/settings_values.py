"""Values of the standalone settings, computed without importing Django or reading the
environment (so ``platform-tasks console`` can use them before Django is set up): the
console's schema, its database entry, the host names it answers to, its counts."""

from __future__ import annotations

import re

from platform_tasks.contrib.django_database import database_from_url as platform_database
from platform_tasks.errors import SettingsError

__all__ = [
    "LOOPBACK_HOSTS",
    "console_schema",
    "database_from_url",
    "positive_int",
    "with_host",
]

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
    entry = platform_database(url, needed_by="the console", conn_max_age=60)
    entry["OPTIONS"] = {
        "options": f"-c search_path={schema}",
        "application_name": "platform-tasks console",
    }
    return entry


def positive_int(name: str, value: str | None, default: int) -> int:
    """A positive whole number from variable ``name`` (``default`` when unset or empty)."""
    raw = (value or "").strip()
    if not raw:
        return default
    try:
        number = int(raw)
    except ValueError:
        number = 0
    if number < 1:
        raise SettingsError([(name, f"must be a whole number of at least 1 (got {raw!r})")])
    return number
