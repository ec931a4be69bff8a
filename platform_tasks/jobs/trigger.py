"""The triggering rules shared by :class:`~platform_tasks.beat.LeaseScheduler` and
:class:`~platform_tasks.testing.JobTestScheduler`: which points to consider at a tick and
what each admission outcome means.

Each active job has one pending point, first the point strictly after start-up (nothing
runs at start-up, nothing missed is caught up). At a tick, points at or before ``now``
are considered: all but the newest are already a full period late and are reported
``skipped_late`` without a round trip; the newest goes to the admission script (one
round trip). A Redis error skips the point (no local fallback) and the rest of the
tick's due points, so a dead Redis costs one failed call per tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import redis

from platform_tasks.jobs.discovery import DiscoveredJob, JobSet
from platform_tasks.jobs.points import from_ms, to_ms
from platform_tasks.leases import AdmissionOutcome, JobLeases, new_token

__all__ = ["PointOutcome", "PointResult", "TriggerEngine"]

logger = logging.getLogger("platform_tasks.jobs")


class PointOutcome(StrEnum):
    """The fate of one considered point."""

    ADMITTED = "admitted"
    SKIPPED_OVERLAP = "skipped_overlap"
    SKIPPED_DUPLICATE = "skipped_duplicate"
    SKIPPED_LATE = "skipped_late"
    SKIPPED_REDIS_ERROR = "skipped_redis_error"
    NOT_YET = "not_yet"  # Redis' clock is behind ours: the point stays pending


_FROM_ADMISSION = {
    AdmissionOutcome.ADMITTED: PointOutcome.ADMITTED,
    AdmissionOutcome.OVERLAP: PointOutcome.SKIPPED_OVERLAP,
    AdmissionOutcome.DUPLICATE: PointOutcome.SKIPPED_DUPLICATE,
    AdmissionOutcome.LATE: PointOutcome.SKIPPED_LATE,
    AdmissionOutcome.FUTURE: PointOutcome.NOT_YET,
}


@dataclass(frozen=True)
class PointResult:
    """One considered point; ``token`` and ``lease_ttl`` matter when admitted."""

    job: str
    point: datetime
    outcome: PointOutcome
    period_end: datetime
    lease_ttl: timedelta
    token: str | None = None
    judged_at_ms: int | None = None

    @property
    def point_ms(self) -> int:
        return to_ms(self.point)

    @property
    def period_end_ms(self) -> int:
        return to_ms(self.period_end)


class TriggerEngine:
    """Pending points of the active jobs and the admission of due ones.

    ``explicit_now`` makes the admission script judge by the tick's ``now`` instead of
    Redis ``TIME``: the one seam explicit-tick tests use, off in production.
    """

    def __init__(
        self,
        jobs: JobSet,
        leases: JobLeases,
        *,
        owner: str,
        started_at: datetime,
        explicit_now: bool = False,
        on_result: Callable[[PointResult], None] | None = None,
    ) -> None:
        self.jobs = {job.name: job for job in jobs.active}
        self.leases = leases
        self.owner = owner
        self.explicit_now = explicit_now
        self.on_result = on_result
        self.pending: dict[str, datetime] = {
            name: job.schedule.next_after(started_at) for name, job in self.jobs.items()
        }
        self.round_trips = 0
        self.considered = 0

    def next_due(self) -> datetime | None:
        return min(self.pending.values(), default=None)

    def tick(self, now: datetime) -> list[PointResult]:
        """Consider every pending point at or before ``now``; return one result each."""
        results: list[PointResult] = []
        redis_down = False
        for name in sorted(self.pending, key=self.pending.__getitem__):
            point = self.pending[name]
            if point > now:
                break  # sorted: nothing later is due either
            job = self.jobs[name]
            point, late = self._newest_due(job, point, now)
            results.extend(late)
            if redis_down:
                result = self._result(job, point, PointOutcome.SKIPPED_REDIS_ERROR)
            else:
                result = self._admit(job, point, now)
                redis_down = result.outcome is PointOutcome.SKIPPED_REDIS_ERROR
            results.append(result)
            if result.outcome is not PointOutcome.NOT_YET:
                self.pending[name] = result.period_end
        self.considered += len(results)
        for result in results:
            self._report(result)
        return results

    def _newest_due(
        self, job: DiscoveredJob, point: datetime, now: datetime
    ) -> tuple[datetime, list[PointResult]]:
        late: list[PointResult] = []
        following = job.schedule.period_end(point)
        while following <= now:
            late.append(self._result(job, point, PointOutcome.SKIPPED_LATE, end=following))
            point = following
            following = job.schedule.period_end(point)
        return point, late

    def _result(
        self, job: DiscoveredJob, point: datetime, outcome: PointOutcome, *,
        end: datetime | None = None, token: str | None = None, judged_at_ms: int | None = None,
    ) -> PointResult:  # fmt: skip
        return PointResult(
            job=job.name,
            point=point,
            outcome=outcome,
            period_end=end or job.schedule.period_end(point),
            lease_ttl=job.schedule.lease_ttl_for(point),
            token=token,
            judged_at_ms=judged_at_ms,
        )

    def _admit(self, job: DiscoveredJob, point: datetime, now: datetime) -> PointResult:
        end = job.schedule.period_end(point)
        ttl = job.schedule.lease_ttl_for(point)
        token = new_token(self.owner)
        self.round_trips += 1
        try:
            admission = self.leases.admit(
                job.name,
                point_ms=to_ms(point),
                period_end_ms=to_ms(end),
                token=token,
                lease_ttl_ms=ttl // timedelta(milliseconds=1),
                now_ms=to_ms(now) if self.explicit_now else None,
            )
        except redis.RedisError as exc:
            logger.warning(
                "admission of %s at %s failed, point skipped: %s", job.name, point.isoformat(),
                exc, extra={"event": "jobs.admission_error", "job": job.name},
            )  # fmt: skip
            return self._result(job, point, PointOutcome.SKIPPED_REDIS_ERROR, end=end)
        outcome = _FROM_ADMISSION[admission.outcome]
        return self._result(
            job, point, outcome, end=end,
            token=token if outcome is PointOutcome.ADMITTED else None,
            judged_at_ms=admission.redis_now_ms,
        )  # fmt: skip

    def _report(self, result: PointResult) -> None:
        logger.info(
            "job point job=%s point_ms=%d period_end_ms=%d outcome=%s judged_at_ms=%s owner=%s",
            result.job, result.point_ms, result.period_end_ms, result.outcome.value,
            result.judged_at_ms, self.owner,
            extra={"event": "jobs.point", "job": result.job, "outcome": result.outcome.value},
        )  # fmt: skip
        if self.on_result is not None:
            self.on_result(result)

    def redis_time(self) -> datetime:
        """The Redis server clock (the judge of every admission)."""
        seconds, micros = self.leases.client.time()
        return from_ms(int(seconds) * 1000 + int(micros) // 1000)
