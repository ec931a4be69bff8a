"""The points of a django-celery-beat periodic task, by the platform's pure point rules.

``LeaseDatabaseScheduler`` decides each run from these points, never from
``last_run_at``:

* **crontab**: evaluated on the wall clock of ``CrontabSchedule.timezone`` with the
  platform's daylight-saving rule (a skipped local time fires once at the end of the gap,
  a repeated one once at its first occurrence; see :mod:`platform_tasks.jobs.points`).
  As in Celery, day of month and day of week must *both* match;
* **interval**: aligned to the Unix epoch (``k * every`` after 1970-01-01T00:00Z), so every
  replica and every restart agrees on the points. This differs from django-celery-beat,
  which counts from ``last_run_at``: a weekly interval fires on the epoch's weekday;
* **clocked** (``one_off`` only): one point at ``clocked_time``, admissible for
  :data:`CLOCKED_WINDOW` after it, never later (a beat started after it does not run it);
* **solar**: the next sun event after an instant, found by Celery's ``solar`` schedule
  (with ``ephem``).

A point's period ends at the next point; it may be admitted until then, never after.
``start_time`` moves the first point to at or after it; ``expires`` ends the points.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from platform_tasks.errors import ConfigurationError
from platform_tasks.jobs.definition import MAX_DEFAULT_LEASE
from platform_tasks.jobs.points import from_ms, local_to_utc, to_ms

__all__ = ["CLOCKED_WINDOW", "MIN_LEASE", "PeriodicTaskError", "TaskPoints", "points_for"]

MIN_LEASE = timedelta(minutes=1)
"""The shortest running lease of a periodic task (see :meth:`TaskPoints.lease_ttl_ms`)."""

CLOCKED_WINDOW = timedelta(minutes=1)
"""How long after its ``clocked_time`` a clocked task may still be admitted."""

_MAX_CRON_STEPS = 2000
_ONE_MS = timedelta(milliseconds=1)


class PeriodicTaskError(ConfigurationError):
    """A periodic task the scheduler cannot honour; the message names the task."""

    def __init__(self, task_name: str, pk: Any, problem: str) -> None:
        super().__init__(f"periodic task {task_name!r} (id {pk}): {problem}")
        self.task_name = task_name
        self.pk = pk
        self.problem = problem


@dataclass(frozen=True)
class TaskPoints:
    """The points of one periodic task; equal values mean the same points (an edit that
    leaves them equal keeps the task's pending point)."""

    kind: str
    cron: str | None = None
    zone: str = "UTC"
    interval_ms: int | None = None
    clocked_ms: int | None = None
    solar: tuple[str, float, float] | None = None
    start_ms: int | None = None
    expires_ms: int | None = None

    def next_after_ms(self, ms: int) -> int | None:
        """The first point strictly after ``ms``; ``None`` when there is none."""
        if self.start_ms is not None and ms < self.start_ms:
            ms = self.start_ms - 1
        point = self._next(ms)
        if point is not None and self.expires_ms is not None and point > self.expires_ms:
            return None
        return point

    def period_end_ms(self, point_ms: int) -> int:
        """When ``point_ms``'s period ends: the next point (or the clocked window)."""
        if self.kind == "clocked":
            return point_ms + CLOCKED_WINDOW // _ONE_MS
        following = self._next(point_ms)
        if following is None:  # the last point: admissible for as long as it would be
            return point_ms + MAX_DEFAULT_LEASE // _ONE_MS
        return following

    @staticmethod
    def lease_ttl_ms(point_ms: int, period_end_ms: int) -> int:
        """The running lease: the point's period, at least :data:`MIN_LEASE`, at most an
        hour. The floor covers the time a trigger waits in the queue before the worker
        first renews the lease; a run releases it when it ends, so it does not slow a
        short task's cadence."""
        period = period_end_ms - point_ms
        return max(MIN_LEASE // _ONE_MS, min(period, MAX_DEFAULT_LEASE // _ONE_MS))

    def _next(self, ms: int) -> int | None:
        if self.interval_ms is not None:
            return (ms // self.interval_ms + 1) * self.interval_ms
        if self.clocked_ms is not None:
            return self.clocked_ms if ms < self.clocked_ms else None
        if self.cron is not None:
            return _cron_next(self.cron, ZoneInfo(self.zone), ms)
        assert self.solar is not None
        return _solar_next(self.solar, ms)


def _cron_next(cron: str, zone: ZoneInfo, ms: int) -> int | None:
    instant = from_ms(ms)
    start = instant.astimezone(zone).replace(tzinfo=None)
    try:
        # day_or=False: Celery's crontab needs day of month AND day of week to match
        iterator = croniter(cron, start, day_or=False)
        for _ in range(_MAX_CRON_STEPS):
            point = local_to_utc(iterator.get_next(datetime), zone)
            if point > instant:
                return to_ms(point)
    except CroniterBadDateError:
        return None
    return None


def _solar_next(solar: tuple[str, float, float], ms: int) -> int:
    from celery.schedules import solar as celery_solar

    event, latitude, longitude = solar
    schedule = celery_solar(event, latitude, longitude)
    start = from_ms(ms).replace(tzinfo=None)
    schedule.cal.date = start
    # Celery's own search (it steps over days without the event at high latitudes)
    found = schedule._next_event(schedule.ephem.Date(start))
    point = to_ms(found.datetime().replace(tzinfo=UTC))
    return point if point > ms else _solar_next(solar, ms + 1000)


def _aware_ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    return to_ms(value if value.tzinfo is not None else value.replace(tzinfo=UTC))


def points_for(task: Any) -> TaskPoints:
    """The points of a ``PeriodicTask`` row; raise :class:`PeriodicTaskError` naming it
    when the scheduler cannot honour it (unknown timezone, bad crontab, solar without
    ``ephem``, clocked without ``one_off``, an interval under one second)."""
    name, pk = task.name, task.pk

    def fail(problem: str) -> PeriodicTaskError:
        return PeriodicTaskError(name, pk, problem)

    window: dict[str, Any] = {
        "start_ms": _aware_ms(task.start_time),
        "expires_ms": _aware_ms(task.expires),
    }
    try:
        if task.interval is not None:
            interval = task.interval
            every = timedelta(**{interval.period: interval.every})
            if every < timedelta(seconds=1):
                raise fail(f"interval {interval.every} {interval.period} is under one second")
            return TaskPoints("interval", interval_ms=math.ceil(every / _ONE_MS), **window)
        if task.crontab is not None:
            return _crontab_points(task.crontab, fail, window)
        if task.clocked is not None:
            if not task.one_off:
                raise fail("a clocked schedule must be one_off (it has a single point)")
            return TaskPoints("clocked", clocked_ms=_aware_ms(task.clocked.clocked_time), **window)
        if task.solar is not None:
            try:
                import ephem  # type: ignore[import-untyped]  # noqa: F401
            except ImportError:
                raise fail(
                    "a solar schedule needs the 'ephem' package (pip install ephem)"
                ) from None
            solar = task.solar
            return TaskPoints(
                "solar",
                solar=(solar.event, float(solar.latitude), float(solar.longitude)),
                **window,
            )
    except PeriodicTaskError:
        raise
    except Exception as exc:  # e.g. a timezone the model field itself cannot load
        raise fail(f"its schedule cannot be read: {exc}") from exc
    raise fail("it has no schedule (interval, crontab, solar or clocked)")


def _crontab_points(
    crontab: Any, fail: Callable[[str], PeriodicTaskError], window: dict[str, Any]
) -> TaskPoints:
    """A ``CrontabSchedule``'s points: its five fields as one cron line, in its zone."""
    zone = str(crontab.timezone)
    try:
        ZoneInfo(zone)
    except (ValueError, KeyError) as exc:
        raise fail(f"crontab timezone {zone!r} is not a known IANA zone") from exc
    fields = (
        crontab.minute,
        crontab.hour,
        crontab.day_of_month,
        crontab.month_of_year,
        crontab.day_of_week,
    )
    cron = " ".join(str(part) for part in fields)
    if not croniter.is_valid(cron):
        raise fail(f"crontab {cron!r} is not a valid schedule")
    return TaskPoints("crontab", cron=cron, zone=zone, **window)
