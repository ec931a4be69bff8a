"""The points of django-celery-beat periodic tasks, with explicit times (no clock).

The rows are real (PostgreSQL through Django's ORM, migrated with the command of
docs/django-celery-beat.md), so the conversion reads exactly what Django admin stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from platform_tasks.jobs.points import to_ms
from platform_tasks.testing.servers import PostgresServer
from tests.support.django_beat import django_beat_database, periodic_task

T = "tests.django_beat.record"


@pytest.fixture
def orm(postgres_server: PostgresServer) -> Iterator[None]:
    django_beat_database(postgres_server)
    yield


def _utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def _after(task: object, instant: datetime) -> datetime | None:
    from platform_tasks.contrib.periodic_points import points_for
    from platform_tasks.jobs.points import from_ms

    ms = points_for(task).next_after_ms(to_ms(instant))
    return None if ms is None else from_ms(ms)


def _crontab(**fields: str) -> object:
    from django_celery_beat.models import CrontabSchedule

    return CrontabSchedule.objects.create(**fields)


def test_crontab_in_berlin_follows_the_platform_dst_rules(orm: None) -> None:
    nightly = periodic_task(
        "nightly", task=T, crontab=_crontab(minute="30", hour="2", timezone="Europe/Berlin")
    )
    # an ordinary winter night: 02:30 CET is 01:30 UTC
    assert _after(nightly, _utc(2025, 1, 10, 12)) == _utc(2025, 1, 11, 1, 30)
    # spring forward (30 March 2025): 02:30 does not exist; it fires once at 03:00 CEST
    assert _after(nightly, _utc(2025, 3, 29, 12)) == _utc(2025, 3, 30, 1, 0)
    assert _after(nightly, _utc(2025, 3, 30, 1, 0)) == _utc(2025, 3, 31, 0, 30)
    # fall back (26 October 2025): 02:30 happens twice; it fires once, the first time (CEST)
    assert _after(nightly, _utc(2025, 10, 25, 12)) == _utc(2025, 10, 26, 0, 30)
    assert _after(nightly, _utc(2025, 10, 26, 0, 30)) == _utc(2025, 10, 27, 1, 30)


def test_crontab_every_15_minutes_across_the_spring_gap(orm: None) -> None:
    quarter = periodic_task(
        "quarter", task=T, crontab=_crontab(minute="*/15", hour="2", timezone="Europe/Berlin")
    )
    # the whole 02:xx hour is skipped: its four points collapse into one at 03:00 CEST
    assert _after(quarter, _utc(2025, 3, 30, 0, 50)) == _utc(2025, 3, 30, 1, 0)
    assert _after(quarter, _utc(2025, 3, 30, 1, 0)) == _utc(2025, 3, 31, 0, 0)


def test_crontab_day_of_month_and_day_of_week_must_both_match_as_in_celery(orm: None) -> None:
    # Friday the 13th at noon UTC; June 2025 has one (the 13th is a Friday)
    friday_13th = periodic_task(
        "f13",
        task=T,
        crontab=_crontab(minute="0", hour="12", day_of_month="13", day_of_week="5", timezone="UTC"),
    )
    assert _after(friday_13th, _utc(2025, 1, 1)) == _utc(2025, 6, 13, 12)


def test_interval_points_are_aligned_to_the_epoch(orm: None) -> None:
    from django_celery_beat.models import IntervalSchedule

    every = IntervalSchedule.objects.create(every=15, period="minutes")
    task = periodic_task("quarterly", task=T, interval=every)
    assert _after(task, _utc(2025, 5, 5, 10, 7, 13)) == _utc(2025, 5, 5, 10, 15)
    week = IntervalSchedule.objects.create(every=7, period="days")
    weekly = periodic_task("weekly", task=T, interval=week)
    # the epoch was a Thursday: a weekly interval fires on Thursdays 00:00 UTC
    assert _after(weekly, _utc(2025, 5, 5)) == _utc(2025, 5, 8)


def test_start_time_expires_and_clocked(orm: None) -> None:
    from django_celery_beat.models import ClockedSchedule, IntervalSchedule

    from platform_tasks.contrib.periodic_points import CLOCKED_WINDOW, points_for

    every = IntervalSchedule.objects.create(every=1, period="hours")
    task = periodic_task(
        "bounded",
        task=T,
        interval=every,
        start_time=_utc(2025, 5, 5, 10, 30),
        expires=_utc(2025, 5, 5, 13),
    )
    assert _after(task, _utc(2025, 5, 5, 8)) == _utc(2025, 5, 5, 11)
    assert _after(task, _utc(2025, 5, 5, 12)) == _utc(2025, 5, 5, 13)
    assert _after(task, _utc(2025, 5, 5, 13)) is None
    at = _utc(2025, 5, 5, 9, 0, 5)
    once = periodic_task(
        "once", task=T, one_off=True, clocked=ClockedSchedule.objects.create(clocked_time=at)
    )
    assert _after(once, _utc(2025, 5, 5)) == at
    assert _after(once, at) is None  # one point only, never again
    points = points_for(once)
    assert points.period_end_ms(to_ms(at)) == to_ms(at + CLOCKED_WINDOW)


def test_unchanged_schedule_gives_equal_points_and_an_edit_does_not(orm: None) -> None:
    from django_celery_beat.models import IntervalSchedule

    from platform_tasks.contrib.periodic_points import points_for

    every = IntervalSchedule.objects.create(every=5, period="seconds")
    task = periodic_task("edited", task=T, interval=every)
    before = points_for(task)
    task.name = "renamed"  # a rename keeps the points (and the key: the primary key)
    task.save()
    assert points_for(task) == before
    task.interval = IntervalSchedule.objects.create(every=6, period="seconds")
    task.save()
    assert points_for(task) != before
    assert timedelta(milliseconds=points_for(task).interval_ms or 0) == timedelta(seconds=6)


def test_solar_points_with_ephem(orm: None) -> None:
    """ephem is in the dev extra, so this runs wherever the suite runs."""
    import ephem  # noqa: F401  (the dependency solar schedules need)
    from django_celery_beat.models import SolarSchedule

    solar = SolarSchedule.objects.create(event="sunrise", latitude=52.52, longitude=13.405)
    task = periodic_task("berlin-sunrise", task=T, solar=solar)
    sunrise = _after(task, _utc(2025, 6, 20, 12))
    assert sunrise is not None
    # Berlin's sunrise on the 21st of June 2025 is at 04:43 CEST (02:43 UTC)
    assert abs(sunrise - _utc(2025, 6, 21, 2, 43)) < timedelta(minutes=3)
    assert _after(task, sunrise) == _after(task, sunrise + timedelta(hours=1))  # the next day
