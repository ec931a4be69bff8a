"""Pure next-point rules: when a job fires, as a function of an instant. No clocks, no I/O.

Beat, the worker's start check and :class:`platform_tasks.testing.JobTestScheduler` all
call these functions, so a test with explicit ticks exercises the production rules.

Intervals align to the Unix epoch: a point is ``k * interval`` after 1970-01-01T00:00Z,
so a 15-minute job fires at :00, :15, :30 and :45 UTC whenever beat started.

Cron expressions are evaluated on the wall clock of the job's zone. Daylight-saving rule:

* a local time that does not exist (spring forward, e.g. 02:30 in Europe/Berlin on the
  last Sunday of March) fires once at the first instant after the gap (03:00 local);
  several skipped times collapse into that one point;
* a local time that occurs twice (fall back, e.g. 02:30 in Europe/Berlin on the last
  Sunday of October) fires once, at its first occurrence (summer time).

Every point is an aware UTC datetime. A point's *period* ends at the next point; a point
may be admitted until then, never after (no catch-up).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from platform_tasks.epoch import EPOCH, epoch_ms, from_epoch_ms
from platform_tasks.errors import JobDefinitionError
from platform_tasks.jobs.definition import MAX_DEFAULT_LEASE, JobDefinition

__all__ = [
    "EPOCH",
    "Schedule",
    "from_ms",
    "local_to_utc",
    "schedule_for",
    "to_ms",
]

_ONE_MS = timedelta(milliseconds=1)
# A cron expression iterates at most a day of minutes past one instant before it must
# have produced a later point; more means the expression can never fire again.
_MAX_CRON_STEPS = 2000


to_ms = epoch_ms
"""Milliseconds since the Unix epoch (the unit Redis scripts compare)."""

from_ms = from_epoch_ms


def _transition_end(lower: datetime, upper: datetime, zone: ZoneInfo) -> datetime:
    """The first instant in ``(lower, upper]`` whose offset differs from ``lower``'s."""
    before = lower.astimezone(zone).utcoffset()
    lo, hi = int(lower.timestamp()), int(upper.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, UTC).astimezone(zone).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return datetime.fromtimestamp(hi, UTC)


def local_to_utc(local: datetime, zone: ZoneInfo) -> datetime:
    """Map a naive wall-clock time of ``zone`` to the instant it fires (see the DST rule)."""
    first = local.replace(tzinfo=zone, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == local:
        return instant  # exists; fold=0 picks the first occurrence of a repeated time
    # In a gap, fold=1 applies the later offset (an instant before the jump) and fold=0
    # the earlier one (an instant after it); the jump itself lies in between.
    early = local.replace(tzinfo=zone, fold=1).astimezone(UTC)
    return _transition_end(early, instant, zone)


@dataclass(frozen=True)
class Schedule:
    """The points of one job definition."""

    cron: str | None
    interval_ms: int | None
    zone: ZoneInfo
    lease_ttl: timedelta | None

    def next_after(self, instant: datetime) -> datetime:
        """The first point strictly after ``instant``.

        Raises :class:`JobDefinitionError` (field ``cron``) when there is none.
        """
        if self.interval_ms is not None:
            ms = to_ms(instant)
            return from_ms((ms // self.interval_ms + 1) * self.interval_ms)
        assert self.cron is not None
        start = instant.astimezone(self.zone).replace(tzinfo=None)
        try:
            iterator = croniter(self.cron, start)
            for _ in range(_MAX_CRON_STEPS):
                local = iterator.get_next(datetime)
                point = local_to_utc(local, self.zone)
                if point > instant:
                    return point
        except CroniterBadDateError:
            pass
        raise JobDefinitionError(
            f"{self.cron!r} has no representable point after {instant.isoformat()}",
            field="cron",
        )

    def period_end(self, point: datetime) -> datetime:
        """When ``point``'s period ends: the job's next point."""
        return self.next_after(point)

    def lease_ttl_for(self, point: datetime) -> timedelta:
        """The running lease for ``point``: the definition's, else its period (max 1 h)."""
        if self.lease_ttl is not None:
            return self.lease_ttl
        return max(timedelta(seconds=1), min(self.period_end(point) - point, MAX_DEFAULT_LEASE))

    # The same rules in integer milliseconds, for the scheduler's hot path: an interval
    # job needs no datetime arithmetic at all.

    def next_after_ms(self, ms: int) -> int:
        """:meth:`next_after` in milliseconds since the epoch."""
        if self.interval_ms is not None:
            return (ms // self.interval_ms + 1) * self.interval_ms
        return to_ms(self.next_after(from_ms(ms)))

    def lease_ttl_ms(self, point_ms: int, period_end_ms: int) -> int:
        """:meth:`lease_ttl_for` in milliseconds, given the point's period end."""
        if self.lease_ttl is not None:
            return self.lease_ttl // _ONE_MS
        return max(1000, min(period_end_ms - point_ms, MAX_DEFAULT_LEASE // _ONE_MS))


def schedule_for(definition: JobDefinition) -> Schedule:
    interval_ms = None
    if definition.interval is not None:
        interval_ms = definition.interval // _ONE_MS
    return Schedule(
        cron=definition.cron,
        interval_ms=interval_ms,
        zone=definition.zone,
        lease_ttl=definition.lease_ttl,
    )
