"""Next-point rules with explicit instants: epoch alignment, cron in zones, DST."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from platform_tasks.errors import JobDefinitionError
from platform_tasks.jobs.definition import define_job
from platform_tasks.jobs.points import schedule_for


def run(ctx: object) -> None:
    """A handler that does nothing."""


def cron(expr: str, zone: str = "UTC"):
    return schedule_for(define_job(handler=run, cron=expr, timezone=zone))


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def points(schedule, start: datetime, count: int) -> list[datetime]:
    found, current = [], start
    for _ in range(count):
        current = schedule.next_after(current)
        found.append(current)
    return found


def test_interval_aligns_to_epoch_whenever_started() -> None:
    schedule = schedule_for(define_job(handler=run, interval=timedelta(minutes=15)))
    assert schedule.next_after(utc(2025, 3, 4, 10, 7, 13)) == utc(2025, 3, 4, 10, 15)
    assert schedule.next_after(utc(2025, 3, 4, 10, 15)) == utc(2025, 3, 4, 10, 30)
    assert points(schedule, utc(2025, 3, 4, 10, 59, 59), 3) == [
        utc(2025, 3, 4, 11, 0),
        utc(2025, 3, 4, 11, 15),
        utc(2025, 3, 4, 11, 30),
    ]


def test_odd_interval_counts_from_epoch_not_from_midnight() -> None:
    schedule = schedule_for(define_job(handler=run, interval=timedelta(seconds=7)))
    point = schedule.next_after(utc(2025, 1, 1))
    assert point.timestamp() % 7 == 0
    assert timedelta(0) < point - utc(2025, 1, 1) <= timedelta(seconds=7)


def test_next_after_is_strictly_after() -> None:
    schedule = cron("0 * * * *")
    assert schedule.next_after(utc(2025, 1, 1, 5)) == utc(2025, 1, 1, 6)


def test_cron_is_evaluated_in_the_job_zone() -> None:
    schedule = cron("0 9 * * *", "America/New_York")
    # 9:00 in New York in January is 14:00 UTC.
    assert schedule.next_after(utc(2025, 1, 10, 12)) == utc(2025, 1, 10, 14)


def test_berlin_spring_forward_skipped_time_fires_at_end_of_gap() -> None:
    # 2025-03-30: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
    schedule = cron("30 2 * * *", "Europe/Berlin")
    assert points(schedule, utc(2025, 3, 29, 12), 2) == [
        utc(2025, 3, 30, 1, 0),  # 02:30 does not exist: fires at 03:00 CEST
        utc(2025, 3, 31, 0, 30),  # 02:30 CEST
    ]


def test_berlin_spring_forward_collapses_skipped_times_into_one_point() -> None:
    schedule = cron("*/20 * * * *", "Europe/Berlin")
    got = points(schedule, utc(2025, 3, 30, 0, 30), 4)
    # 01:40 CET, then 02:00/02:20/02:40 (skipped) collapse into 03:00 CEST, then 03:20.
    assert got == [
        utc(2025, 3, 30, 0, 40),
        utc(2025, 3, 30, 1, 0),
        utc(2025, 3, 30, 1, 20),
        utc(2025, 3, 30, 1, 40),
    ]


def test_berlin_fall_back_repeated_time_fires_once_at_first_occurrence() -> None:
    # 2025-10-26: 03:00 CEST falls back to 02:00 CET (01:00 UTC); 02:30 happens twice.
    schedule = cron("30 2 * * *", "Europe/Berlin")
    assert points(schedule, utc(2025, 10, 25, 12), 2) == [
        utc(2025, 10, 26, 0, 30),  # 02:30 CEST, the first occurrence
        utc(2025, 10, 27, 1, 30),  # next day 02:30 CET
    ]


def test_berlin_fall_back_hourly_does_not_repeat_the_hour() -> None:
    schedule = cron("0 * * * *", "Europe/Berlin")
    got = points(schedule, utc(2025, 10, 25, 23, 30), 4)
    # from 01:30 CEST: 02:00 CEST, (02:00 CET not repeated), 03:00 CET, 04:00 CET, 05:00 CET
    assert got == [
        utc(2025, 10, 26, 0),
        utc(2025, 10, 26, 2),
        utc(2025, 10, 26, 3),
        utc(2025, 10, 26, 4),
    ]


def test_berlin_fall_back_from_inside_the_second_occurrence() -> None:
    schedule = cron("*/30 * * * *", "Europe/Berlin")
    # 01:10 UTC is 02:10 CET (second pass); 02:30 local already fired in the first pass.
    assert schedule.next_after(utc(2025, 10, 26, 1, 10)) == utc(2025, 10, 26, 2, 0)


def test_new_york_spring_forward() -> None:
    # 2025-03-09: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
    schedule = cron("15 2 * * *", "America/New_York")
    assert points(schedule, utc(2025, 3, 8, 12), 2) == [
        utc(2025, 3, 9, 7, 0),  # 02:15 skipped: fires at 03:00 EDT
        utc(2025, 3, 10, 6, 15),  # 02:15 EDT
    ]


def test_new_york_fall_back() -> None:
    # 2025-11-02: 02:00 EDT falls back to 01:00 EST (06:00 UTC); 01:30 happens twice.
    schedule = cron("30 1 * * *", "America/New_York")
    assert points(schedule, utc(2025, 11, 1, 12), 2) == [
        utc(2025, 11, 2, 5, 30),  # 01:30 EDT, first occurrence only
        utc(2025, 11, 3, 6, 30),  # 01:30 EST next day
    ]


def test_points_are_strictly_increasing_across_transitions() -> None:
    for zone in ("Europe/Berlin", "America/New_York"):
        schedule = cron("*/7 * * * *", zone)
        for start in (utc(2025, 3, 8), utc(2025, 3, 29), utc(2025, 10, 25), utc(2025, 11, 1)):
            got = points(schedule, start, 600)
            assert all(a < b for a, b in itertools.pairwise(got))
            for point in got:
                local = point.astimezone(ZoneInfo(zone))
                assert local.minute % 7 == 0 or local.minute == 0


def test_cron_without_representable_point_raises_naming_cron() -> None:
    with pytest.raises(JobDefinitionError) as info:
        cron("0 0 30 2 *").next_after(utc(2025, 1, 1))
    assert info.value.field == "cron"


def test_period_end_and_default_lease() -> None:
    schedule = cron("0 */2 * * *")
    point = utc(2025, 1, 1, 4)
    assert schedule.period_end(point) == utc(2025, 1, 1, 6)
    assert schedule.lease_ttl_for(point) == timedelta(hours=1)  # capped
    short = schedule_for(define_job(handler=run, interval=timedelta(seconds=90)))
    assert short.lease_ttl_for(utc(2025, 1, 1)) == timedelta(seconds=90)
    explicit = schedule_for(
        define_job(handler=run, interval=timedelta(hours=3), lease_ttl=timedelta(minutes=5))
    )
    assert explicit.lease_ttl_for(utc(2025, 1, 1)) == timedelta(minutes=5)


@pytest.mark.parametrize(
    "schedule",
    [
        schedule_for(define_job(handler=run, interval=timedelta(seconds=7))),
        schedule_for(define_job(handler=run, interval=timedelta(hours=2))),
        schedule_for(
            define_job(handler=run, interval=timedelta(minutes=5), lease_ttl=timedelta(seconds=90))
        ),
        cron("*/20 * * * *", "Europe/Berlin"),
        cron("30 2 * * *", "America/New_York"),
    ],
)
def test_millisecond_rules_agree_with_the_datetime_rules(schedule) -> None:
    from platform_tasks.jobs.points import to_ms

    # across the Berlin and New York transitions of 2025, from odd instants
    for start in (
        utc(2025, 3, 30, 0, 41, 3),
        utc(2025, 10, 26, 0, 10),
        utc(2025, 3, 9, 6, 59, 59),
        utc(2025, 11, 2, 5, 30),
    ):
        current = start
        for _ in range(6):
            point = schedule.next_after(current)
            assert schedule.next_after_ms(to_ms(current)) == to_ms(point)
            end = schedule.period_end(point)
            ttl = schedule.lease_ttl_for(point) // timedelta(milliseconds=1)
            assert schedule.lease_ttl_ms(to_ms(point), to_ms(end)) == ttl
            current = point
