"""Sentry's beat integration keeps working: ``LeaseDatabaseScheduler`` sends through the
base class's ``apply_entry``, which ``CeleryIntegration(monitor_beat_tasks=True)`` wraps
to send the Crons check-in of the entry it sends.

A fresh interpreter (Sentry and Django are process-wide) initialises Sentry against a
Sentry endpoint on loopback, builds the scheduler on the real PostgreSQL and Redis and
ticks once. To avoid waiting for a minute boundary, the script sets the task's pending
point to the current minute's point of its ``* * * * *`` crontab (a real point of the
schedule, still inside its period); admission and sending are the production code.
"""

from __future__ import annotations

import os
import subprocess
import sys

from platform_tasks.testing.servers import PostgresServer, wait_until
from tests.conftest import REPO_ROOT
from tests.support.django_beat import SETTINGS_MODULE, django_beat_database, periodic_task
from tests.support.sentry_receiver import SentryReceiver

SCRIPT = """
import os
import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration

sentry_sdk.init(dsn=os.environ["HOST_SENTRY_DSN"],
                integrations=[CeleryIntegration(monitor_beat_tasks=True)])
from platform_tasks import create_app
from platform_tasks.contrib.django_celery_beat import LeaseDatabaseScheduler

scheduler = LeaseDatabaseScheduler(app=create_app("dcb_sentry"))
[item] = [p for p in scheduler._pending.values() if p.name == "minutely-report"]
now = scheduler._redis_now_ms()
item.point_ms = now - now % 60_000
scheduler.tick()
sentry_sdk.flush(10)
scheduler.close()
"""


def test_sentry_beat_check_in_goes_out_for_an_admitted_point(
    postgres_server: PostgresServer, redis_url: str
) -> None:
    database_url = django_beat_database(postgres_server)
    from django_celery_beat.models import CrontabSchedule

    every_minute = CrontabSchedule.objects.create(minute="*", hour="*", timezone="UTC")
    periodic_task("minutely-report", task="tests.django_beat.record", crontab=every_minute)
    with SentryReceiver() as sentry:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PLATFORM_", "SENTRY_"))}
        env.update(
            PLATFORM_REDIS_URL=redis_url,
            PLATFORM_DATABASE_URL=database_url,
            PLATFORM_PROFILE="test",
            DJANGO_SETTINGS_MODULE=SETTINGS_MODULE,
            HOST_SENTRY_DSN=sentry.dsn,
        )
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        wait_until(lambda: sentry.check_ins, timeout=30, message="the beat check-in")
    [check_in] = sentry.check_ins
    assert check_in["monitor_slug"] == "minutely-report"
    assert check_in["status"] == "in_progress"
    assert check_in["monitor_config"]["schedule"] == {"type": "crontab", "value": "* * * * *"}
