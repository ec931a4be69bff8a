"""``LeaseDatabaseScheduler`` refuses, at start-up, periodic tasks it cannot honour, and
names them; a valid schedule starts. Real PostgreSQL (Django ORM) and real Redis."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg2
import pytest

from platform_tasks import create_app
from platform_tasks.errors import ConfigurationError
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import PostgresServer
from tests.support.django_beat import django_beat_database, periodic_task

T = "tests.django_beat.record"


@pytest.fixture
def database(postgres_server: PostgresServer) -> Iterator[str]:
    yield django_beat_database(postgres_server)


def _scheduler(redis_url: str) -> object:
    from platform_tasks.contrib.django_celery_beat import LeaseDatabaseScheduler

    app = create_app(
        "dcb_startup", settings=PlatformSettings.build(redis_url=redis_url, profile="test")
    )
    return LeaseDatabaseScheduler(app=app)


def test_unknown_timezone_is_refused_naming_the_task(database: str, redis_url: str) -> None:
    from django_celery_beat.models import CrontabSchedule

    crontab = CrontabSchedule.objects.create(minute="0", hour="3", timezone="Europe/Berlin")
    periodic_task("nightly-report", task=T, crontab=crontab)
    conn = psycopg2.connect(database)
    with conn, conn.cursor() as cur:  # what a hand-edited row or an old tz database leaves
        cur.execute("UPDATE django_celery_beat_crontabschedule SET timezone = 'Mars/Olympus'")
    conn.close()
    with pytest.raises(ConfigurationError) as raised:
        _scheduler(redis_url)
    assert "'nightly-report'" in str(raised.value) and "Mars/Olympus" in str(raised.value)


def test_clocked_without_one_off_is_refused(database: str, redis_url: str) -> None:
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    clocked = ClockedSchedule.objects.create(clocked_time=datetime(2030, 1, 1, tzinfo=UTC))
    task = periodic_task("launch", task=T, clocked=clocked, one_off=True)
    PeriodicTask.objects.filter(pk=task.pk).update(one_off=False)  # admin validation bypassed
    with pytest.raises(ConfigurationError, match=r"'launch'.*must be one_off"):
        _scheduler(redis_url)


def test_solar_without_ephem_is_refused(
    database: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_celery_beat.models import SolarSchedule

    solar = SolarSchedule.objects.create(event="sunrise", latitude=52.52, longitude=13.405)
    periodic_task("sunrise-lights", task=T, solar=solar)
    monkeypatch.setitem(sys.modules, "ephem", None)  # as if ephem were not installed
    with pytest.raises(ConfigurationError, match=r"'sunrise-lights'.*ephem"):
        _scheduler(redis_url)


def test_valid_tasks_start_and_every_problem_is_listed(database: str, redis_url: str) -> None:
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule

    every = IntervalSchedule.objects.create(every=10, period="seconds")
    periodic_task("fine", task=T, interval=every)
    scheduler = _scheduler(redis_url)
    try:
        assert "fine" in scheduler.schedule  # type: ignore[attr-defined]
    finally:
        scheduler.close()  # type: ignore[attr-defined]
    periodic_task(
        "bad-cron",
        task=T,
        crontab=CrontabSchedule.objects.create(minute="75", hour="*", timezone="UTC"),
    )
    with pytest.raises(ConfigurationError, match=r"'bad-cron'.*not a valid schedule"):
        _scheduler(redis_url)
