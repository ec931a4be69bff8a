"""The ``django`` extra installs a django-celery-beat that works with the Celery and Django here.

django-celery-beat 2.8.0 was yanked: its scheduler rewrite stopped crontab tasks with a
time zone from running (celery/django-celery-beat#875); 2.7.x caps Django below 5.2. The
extra pins ``>=2.8.1,<2.10``. The check runs in a fresh interpreter (Django settings are
process-wide) against the suite's real PostgreSQL, in a database of its own.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import requires, version
from pathlib import Path

import psycopg2
from packaging.requirements import Requirement

from platform_tasks.testing.servers import PostgresServer

REPO_ROOT = Path(__file__).resolve().parents[3]

_CHECK = """
import sys
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django_celery_beat"],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": sys.argv[1],
                           "USER": "postgres", "HOST": "127.0.0.1", "PORT": sys.argv[2]}},
    USE_TZ=True, TIME_ZONE="UTC", DEFAULT_AUTO_FIELD="django.db.models.AutoField",
)
django.setup()
from django.core.management import call_command
call_command("migrate", "django_celery_beat", verbosity=0)

from celery import Celery
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler

# hour "*": since 2.8 the scheduler loads numeric-hour crontabs only near the current hour
cron = CrontabSchedule.objects.create(minute="30", hour="*", timezone="Europe/Berlin")
PeriodicTask.objects.create(name="half_past", task="billing.half_past", crontab=cron)
every = IntervalSchedule.objects.create(every=5, period=IntervalSchedule.MINUTES)
PeriodicTask.objects.create(name="every_5m", task="billing.poll", interval=every)
app = Celery("django_extra_check", broker="memory://", set_as_current=False)
app.conf.timezone = "UTC"
schedule = DatabaseScheduler(app=app, lazy=True).all_as_schedule()
print(sorted(schedule))
"""


def test_django_extra_pins_a_working_django_celery_beat() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    extra = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["django"]]
    beat = next(r for r in extra if r.name == "django-celery-beat")
    assert "2.8.0" not in beat.specifier and "2.7.0" not in beat.specifier
    assert version("django-celery-beat") in beat.specifier
    assert all(version(r.name) in r.specifier for r in extra)
    # the installed release accepts the installed Celery
    celery_pin = next(
        Requirement(r)
        for r in requires("django-celery-beat") or []
        if r.lower().startswith("celery")
    )
    assert version("celery") in celery_pin.specifier


def test_django_celery_beat_migrates_and_schedules_on_postgres(
    postgres_server: PostgresServer,
) -> None:
    admin = psycopg2.connect(postgres_server.admin_url())
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS django_extra_check")
            cur.execute("CREATE DATABASE django_extra_check")
    finally:
        admin.close()
    port = str(postgres_server.port)
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, "django_extra_check", port],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "['every_5m', 'half_past']", done.stdout
