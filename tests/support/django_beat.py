"""django-celery-beat's tables in the harness PostgreSQL, and Django set up for them.

One database (``django_beat``) per test session, created and migrated with the command
docs/django-celery-beat.md gives (``python -m django migrate`` with the standalone settings
module); this process then uses Django's ORM on it the way an admin edit would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import suppress
from typing import Any

import psycopg2

from platform_tasks.testing.servers import PostgresServer

DATABASE = "django_beat"
SETTINGS_MODULE = "platform_tasks.contrib.django_settings"

_url: str | None = None
TABLES = (
    "periodictask",
    "periodictasks",
    "intervalschedule",
    "crontabschedule",
    "clockedschedule",
    "solarschedule",
)


def _database_url(server: PostgresServer) -> str:
    return server.url.rsplit("/", 1)[0] + f"/{DATABASE}"


def migrate_command_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLATFORM_", "DJANGO_"))}
    env.update(PLATFORM_DATABASE_URL=url, DJANGO_SETTINGS_MODULE=SETTINGS_MODULE)
    return env


def django_beat_database(server: PostgresServer) -> str:
    """URL of the migrated database, emptied of periodic tasks; Django set up on it."""
    global _url
    if _url is None:
        url = _database_url(server)
        conn = psycopg2.connect(server.admin_url())
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
            cur.execute(f"CREATE DATABASE {DATABASE}")
        conn.close()
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--verbosity", "0"],
            env=migrate_command_env(url),
            check=True,
            timeout=300,
        )
        _setup_django(url)
        _url = url
    conn = psycopg2.connect(_url)
    with conn, conn.cursor() as cur:  # raw SQL: a row a test broke on purpose cannot load
        cur.execute("TRUNCATE " + ", ".join(f"django_celery_beat_{t}" for t in TABLES) + " CASCADE")
    conn.close()
    return _url


def _setup_django(url: str) -> None:
    import django

    previous = {k: os.environ.get(k) for k in ("PLATFORM_DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    os.environ.update(PLATFORM_DATABASE_URL=url, DJANGO_SETTINGS_MODULE=SETTINGS_MODULE)
    try:
        django.setup()
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def close_connections() -> None:
    """Close this process's ORM connections (before a test drops or reuses the database)."""
    with suppress(Exception):
        from django.db import connections

        connections.close_all()


def periodic_task(name: str, **fields: Any) -> Any:
    """Create a periodic task as an admin would (``save()``: its change signal fires)."""
    from django_celery_beat.models import PeriodicTask

    task = PeriodicTask(name=name, **fields)
    task.save()
    return task
