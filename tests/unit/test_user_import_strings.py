"""Every import string a user writes keeps resolving, whatever folder the code lives in.

The strings come from the README, docs/, CONTRACT-facing names and pyproject's entry
points; they are resolved the way Celery, kombu and pytest resolve them
(``symbol_by_name`` for ``module:attribute``, an import for a module).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from kombu.utils.imports import symbol_by_name

ROOT = Path(__file__).resolve().parents[2]

USER_STRINGS = [
    # the app factory's defaults, written out by users who configure Celery themselves
    "platform_tasks.beat:LeaseScheduler",
    "platform_tasks.transport:Transport",
    # the public face
    "platform_tasks:create_app",
    "platform_tasks:PlatformCelery",
    "platform_tasks:PlatformTask",
    "platform_tasks:QueuePort",
    "platform_tasks:Envelope",
    "platform_tasks:RetryPolicy",
    "platform_tasks:PermanentError",
    "platform_tasks:PlatformSettings",
    "platform_tasks.settings:PlatformSettings",
    "platform_tasks.task:PlatformTask",
    "platform_tasks.queue_port:QueuePort",
    "platform_tasks.queue_port:PublishOptions",
    # scheduled jobs, fan-out, notifications (docs/scheduled-jobs.md, fanout.md, notifications.md)
    "platform_tasks.jobs:define_job",
    "platform_tasks.jobs:JobContext",
    "platform_tasks.jobs:JobDefinition",
    "platform_tasks.maintenance:purge_expired_processed_jobs",
    "platform_tasks.maintenance:report_stale_dead_letters",
    "platform_tasks.fanout:fan_out",
    "platform_tasks.fanout:install",
    "platform_tasks.notifications:EmailMessage",
    "platform_tasks.notifications:NotificationTask",
    "platform_tasks.notifications:publish_blast",
    "platform_tasks.notifications:notification_queue",
    # pytest kit
    "platform_tasks.testing:create_test_app",
    "platform_tasks.testing:JobTestScheduler",
    "platform_tasks.contrib.beat_leases:install_lease_renewal",
]

DJANGO_STRINGS = [
    "platform_tasks.contrib.django_celery_beat:LeaseDatabaseScheduler",
    "platform_tasks.contrib.django_settings",
]
"""Resolved in a process of their own: they configure Django for the whole process."""


def _entry_points() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    strings = list(project["scripts"].values())
    for group in project["entry-points"].values():
        strings.extend(group.values())
    return strings


def _resolve(string: str) -> object:
    if ":" in string:
        return symbol_by_name(string)
    return importlib.import_module(string)


@pytest.mark.parametrize("string", USER_STRINGS)
def test_a_user_import_string_resolves(string: str) -> None:
    assert _resolve(string) is not None


@pytest.mark.parametrize("string", _entry_points())
def test_an_entry_point_resolves(string: str) -> None:
    assert _resolve(string) is not None


@pytest.mark.parametrize("string", DJANGO_STRINGS)
def test_a_django_import_string_resolves(string: str) -> None:
    # the settings module reads the database URL at import; nothing connects to it
    env = {**os.environ, "PLATFORM_DATABASE_URL": "postgresql://user@127.0.0.1:1/db"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    code = (
        "import os, sys; from kombu.utils.imports import symbol_by_name;"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'platform_tasks.contrib.django_settings');"
        "import django; django.setup(); symbol_by_name(sys.argv[1])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, string], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_the_re_exports_are_the_moved_objects() -> None:
    from platform_tasks.brokers.transport import Transport
    from platform_tasks.jobs.beat import LeaseScheduler
    from platform_tasks.postgres import maintenance
    from platform_tasks.publishing.queue_port import QueuePort

    assert symbol_by_name("platform_tasks.beat:LeaseScheduler") is LeaseScheduler
    assert symbol_by_name("platform_tasks.transport:Transport") is Transport
    assert symbol_by_name("platform_tasks.queue_port:QueuePort") is QueuePort
    assert (
        symbol_by_name("platform_tasks.maintenance:purge_expired_processed_jobs")
        is maintenance.purge_expired_processed_jobs
    )


def test_the_app_defaults_name_strings_that_resolve() -> None:
    from platform_tasks.app import BEAT_SCHEDULER, PlatformCelery

    assert symbol_by_name(BEAT_SCHEDULER).__name__ == "LeaseScheduler"
    assert symbol_by_name(PlatformCelery.events_cls).__name__ == "PlatformEvents"
