"""The triggering rules shared by :class:`~platform_tasks.beat.LeaseScheduler` and
:class:`~platform_tasks.testing.JobTestScheduler`: which points to consider at a tick and
what each admission outcome means.

Each active job has one pending point, first the point strictly after start-up (nothing
runs at start-up, nothing missed is caught up). The pending points sit in a heap keyed by
due time, so a tick touches only the due ones. At a tick, points at or before ``now`` are
considered: for each job, all but the newest are already a full period late and are
reported ``skipped_late`` without a round trip; the newest goes to the admission script.
The due points of a tick are admitted in batches of at most ``batch_size``, each batch
one pipeline (one atomic script call per point, one network round trip per batch). A
Redis error skips the point (no local fallback) and the rest of the tick's due points,
so a dead Redis costs one failed round trip per tick.

Per-point outcomes are logged at DEBUG (logger ``platform_tasks.jobs.points``, event
``jobs.point``); each tick that considered points logs one INFO summary (``jobs.tick``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import redis

from platform_tasks.brokers.redis_client import REDIS_ERRORS
from platform_tasks.brokers.server_time import redis_now_ms
from platform_tasks.jobs.discovery import DiscoveredJob, JobSet
from platform_tasks.jobs.leases import (
    Admission,
    AdmissionOutcome,
    AdmissionRequest,
    JobLeases,
    new_token,
)
from platform_tasks.jobs.points import from_ms, to_ms

__all__ = ["DEFAULT_BATCH_SIZE", "PointOutcome", "PointResult", "TriggerEngine"]

logger = logging.getLogger("platform_tasks.jobs")
point_logger = logging.getLogger("platform_tasks.jobs.points")

DEFAULT_BATCH_SIZE = 500
"""Points admitted per pipeline: big enough to amortise the round trip, small enough
that the first triggers of a large burst are sent while later ones are still judged."""


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
    """One considered point; ``token`` and ``lease_ttl`` matter when admitted.

    Times are kept in milliseconds since the epoch (what the scripts compare); the
    datetime views are computed on access.
    """

    job: str
    point_ms: int
    outcome: PointOutcome
    period_end_ms: int
    lease_ttl_ms: int
    token: str | None = None
    judged_at_ms: int | None = None

    @property
    def point(self) -> datetime:
        return from_ms(self.point_ms)

    @property
    def period_end(self) -> datetime:
        return from_ms(self.period_end_ms)

    @property
    def lease_ttl(self) -> timedelta:
        return timedelta(milliseconds=self.lease_ttl_ms)


@dataclass
class _Due:
    """A job's newest due point, waiting for its admission in this tick. ``again``: the
    point was considered by an earlier tick and is asked about once more."""

    job: DiscoveredJob
    point_ms: int
    period_end_ms: int
    lease_ttl_ms: int
    again: bool = False


class TriggerEngine:
    """Pending points of the active jobs and the admission of due ones.

    ``explicit_now`` makes the admission script judge by the tick's ``now`` instead of
    Redis ``TIME``: the one seam explicit-tick tests use, off in production.

    ``reconsider_current`` (explicit-tick tests only) makes every tick consider each
    job's *current* point, the newest one at or before ``now`` that is after start-up,
    even when an earlier tick already considered it: the script then answers for it
    again (an admitted point comes back ``skipped_duplicate``), except that a point
    skipped for a Redis error is reported so again without asking, as it is never
    retried. Beat considers each point once.
    """

    def __init__(
        self,
        jobs: JobSet,
        leases: JobLeases,
        *,
        owner: str,
        started_at: datetime,
        explicit_now: bool = False,
        reconsider_current: bool = False,
        on_result: Callable[[PointResult], None] | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if reconsider_current and not explicit_now:
            raise ValueError("reconsider_current needs explicit_now (explicit-tick tests)")
        self.reconsider_current = reconsider_current
        # Newest considered point of each job and its outcome (kept when reconsidering).
        self._considered: dict[str, tuple[_Due, PointOutcome]] = {}
        self.jobs = {job.name: job for job in jobs.active}
        self.leases = leases
        self.owner = owner
        self.explicit_now = explicit_now
        self.on_result = on_result
        self.batch_size = batch_size
        start_ms = to_ms(started_at)
        self._pending_ms: dict[str, int] = {
            name: job.schedule.next_after_ms(start_ms) for name, job in self.jobs.items()
        }
        # One entry per active job: (due ms, name). Popped when due, pushed back with
        # the job's next pending point in the same tick.
        self._heap = [(ms, name) for name, ms in self._pending_ms.items()]
        heapq.heapify(self._heap)
        self.round_trips = 0
        self.considered = 0
        # Lease tokens: unique per admission (owner, a per-engine random session, a
        # counter) without a uuid4 per point.
        self._token_prefix = new_token(owner)
        self._tokens = itertools.count(1)

    @property
    def pending(self) -> dict[str, datetime]:
        """Each active job's pending point."""
        return {name: from_ms(ms) for name, ms in self._pending_ms.items()}

    def next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def next_due(self) -> datetime | None:
        ms = self.next_due_ms()
        return None if ms is None else from_ms(ms)

    def tick(self, now: datetime) -> list[PointResult]:
        """Consider every pending point at or before ``now``; return one result each."""
        return [result for batch in self.tick_batches(now) for result in batch]

    def tick_batches(self, now: datetime) -> Iterator[list[PointResult]]:
        """:meth:`tick` one admission pipeline at a time, so a caller can act on (send)
        each batch's admitted points while the next batch is still to be judged.

        The tick's due points are taken off the heap before the first batch is yielded,
        so abandoning the iterator early leaves them unconsidered: consume it fully.
        """
        now_ms = to_ms(now)
        due: list[_Due] = []
        late: list[PointResult] = []
        while self._heap and self._heap[0][0] <= now_ms:
            point_ms, name = heapq.heappop(self._heap)
            due.append(self._newest_due(self.jobs[name], point_ms, now_ms, late))
        again: list[PointResult] = []
        if self.reconsider_current:
            due += self._current_again(now_ms, {d.job.name for d in due}, again)
            due.sort(key=lambda d: (d.point_ms, d.job.name))
        if not due and not again:
            return
        counts: Counter[str] = Counter()
        if late or again:
            local = sorted([*late, *again], key=lambda r: (r.point_ms, r.job))
            self._finish(local, counts)
            yield local
        redis_down = False
        for start in range(0, len(due), self.batch_size):
            chunk = due[start : start + self.batch_size]
            if redis_down:
                results = [self._result(d, PointOutcome.SKIPPED_REDIS_ERROR) for d in chunk]
            else:
                results = self._admit(chunk, now_ms)
                redis_down = any(r.outcome is PointOutcome.SKIPPED_REDIS_ERROR for r in results)
            for item, result in zip(chunk, results, strict=True):
                if item.again:
                    continue  # its job's next point is still on the heap
                if self.reconsider_current:
                    self._considered[item.job.name] = (item, result.outcome)
                pending = (
                    item.point_ms
                    if result.outcome is PointOutcome.NOT_YET
                    else (item.period_end_ms)
                )
                self._pending_ms[item.job.name] = pending
                heapq.heappush(self._heap, (pending, item.job.name))
            self._finish(results, counts)
            yield results
        logger.info(
            "jobs tick owner=%s considered=%d %s",
            self.owner,
            sum(counts.values()),
            " ".join(f"{k}={v}" for k, v in sorted(counts.items())),
            extra={"event": "jobs.tick", "owner": self.owner, "counts": dict(counts)},
        )

    def _newest_due(
        self, job: DiscoveredJob, point_ms: int, now_ms: int, late: list[PointResult]
    ) -> _Due:
        schedule = job.schedule
        following = schedule.next_after_ms(point_ms)
        while following <= now_ms:
            ttl = schedule.lease_ttl_ms(point_ms, following)
            late.append(PointResult(job.name, point_ms, PointOutcome.SKIPPED_LATE, following, ttl))
            point_ms = following
            following = schedule.next_after_ms(point_ms)
        return _Due(job, point_ms, following, schedule.lease_ttl_ms(point_ms, following))

    def _current_again(self, now_ms: int, taken: set[str], local: list[PointResult]) -> list[_Due]:
        """The already considered points that are still current at ``now_ms``: those to
        ask the script about again; those skipped for a Redis error go to ``local``."""
        ask: list[_Due] = []
        for name, (item, outcome) in self._considered.items():
            if name in taken or not item.point_ms <= now_ms < item.period_end_ms:
                continue
            if outcome is PointOutcome.SKIPPED_REDIS_ERROR:
                local.append(self._result(item, outcome))
            else:
                ask.append(
                    _Due(item.job, item.point_ms, item.period_end_ms, item.lease_ttl_ms, again=True)
                )
        return ask

    def _result(
        self,
        due: _Due,
        outcome: PointOutcome,
        token: str | None = None,
        judged_at_ms: int | None = None,
    ) -> PointResult:
        return PointResult(
            due.job.name,
            due.point_ms,
            outcome,
            due.period_end_ms,
            due.lease_ttl_ms,
            token,
            judged_at_ms,
        )

    def _token(self) -> str:
        return f"{self._token_prefix}:{next(self._tokens)}"

    def _admit(self, chunk: list[_Due], now_ms: int) -> list[PointResult]:
        requests = [
            AdmissionRequest(d.job.name, d.point_ms, d.period_end_ms, self._token(), d.lease_ttl_ms)
            for d in chunk
        ]
        self.round_trips += 1
        try:
            answers: list[Admission | redis.RedisError] = self.leases.admit_many(
                requests, now_ms=now_ms if self.explicit_now else None
            )
        except REDIS_ERRORS as exc:
            logger.warning(
                "admission of %d point(s) failed, points skipped: %s",
                len(chunk),
                exc,
                extra={"event": "jobs.admission_error"},
            )
            return [self._result(d, PointOutcome.SKIPPED_REDIS_ERROR) for d in chunk]
        results = []
        for due, request, answer in zip(chunk, requests, answers, strict=True):
            if isinstance(answer, redis.RedisError):
                logger.warning(
                    "admission of %s at %d failed, point skipped: %s",
                    due.job.name,
                    due.point_ms,
                    answer,
                    extra={"event": "jobs.admission_error", "job": due.job.name},
                )
                results.append(self._result(due, PointOutcome.SKIPPED_REDIS_ERROR))
                continue
            outcome = _FROM_ADMISSION[answer.outcome]
            token = request.token if outcome is PointOutcome.ADMITTED else None
            results.append(self._result(due, outcome, token, answer.redis_now_ms))
        return results

    def _finish(self, results: list[PointResult], counts: Counter[str]) -> None:
        self.considered += len(results)
        debug = point_logger.isEnabledFor(logging.DEBUG)
        for result in results:
            counts[result.outcome.value] += 1
            if debug:
                point_logger.debug(
                    "job point job=%s point_ms=%d period_end_ms=%d outcome=%s "
                    "judged_at_ms=%s owner=%s",
                    result.job,
                    result.point_ms,
                    result.period_end_ms,
                    result.outcome.value,
                    result.judged_at_ms,
                    self.owner,
                    extra={
                        "event": "jobs.point",
                        "job": result.job,
                        "outcome": result.outcome.value,
                    },
                )
            if self.on_result is not None:
                self.on_result(result)

    def redis_time(self) -> datetime:
        """The Redis server clock (the judge of every admission)."""
        return from_ms(redis_now_ms(self.leases.client))
