"""Run one admitted point's handler under its running lease.

The same function runs inside a worker (the ``platform.jobs.run`` task) and inline in
:class:`~platform_tasks.testing.JobTestScheduler`. Before the handler starts, one script
call checks with Redis time that the point's period has not ended while the trigger
waited in the queue (then it is skipped, not run late) and that the lease is still ours.
While the handler runs, a thread renews the lease every ``lease_ttl / 3``; a failed
renewal sets ``ctx.cancel_requested``. Handler errors are logged and sent to Sentry;
nothing is retried and return values are dropped.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from platform_tasks.brokers.redis_client import REDIS_ERRORS
from platform_tasks.jobs import monitoring
from platform_tasks.jobs.discovery import JobSet
from platform_tasks.jobs.leases import JobLeases, LeaseOutcome
from platform_tasks.jobs.points import from_ms
from platform_tasks.observability.scheduler_metrics import lease_renewal_failed

__all__ = ["JobContext", "RunOutcome", "RunRegistry", "run_point"]

logger = logging.getLogger("platform_tasks.jobs")


@dataclass(frozen=True)
class JobContext:
    """What a handler ``run(ctx)`` receives."""

    name: str
    scheduled_for: datetime
    cancel_requested: threading.Event
    logger: logging.Logger


class RunOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED_LATE = "skipped_late_start"
    SKIPPED_LEASE_LOST = "skipped_lease_lost"
    SKIPPED_UNKNOWN_JOB = "skipped_unknown_job"
    SKIPPED_REDIS_ERROR = "skipped_redis_error"


@dataclass
class _Run:
    job: str
    token: str
    cancel: threading.Event
    done: threading.Event = field(default_factory=threading.Event)


class RunRegistry:
    """The runs of this process, so shutdown can request their cancellation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}

    def add(self, run: _Run) -> None:
        with self._lock:
            self._runs[run.token] = run

    def remove(self, run: _Run) -> None:
        with self._lock:
            self._runs.pop(run.token, None)
        run.done.set()

    def running(self) -> list[_Run]:
        with self._lock:
            return list(self._runs.values())

    def cancel_all(self) -> int:
        runs = self.running()
        for run in runs:
            run.cancel.set()
        return len(runs)


REGISTRY = RunRegistry()


class _Renewer(threading.Thread):
    """Renews the lease every ``ttl / 3`` until stopped; on failure requests cancellation."""

    def __init__(self, leases: JobLeases, run: _Run, ttl_ms: int) -> None:
        super().__init__(name=f"platform-lease-{run.job}", daemon=True)
        self.leases = leases
        self.run_ = run
        self.ttl_ms = ttl_ms
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = self.ttl_ms / 3000.0
        while not self.stopped.wait(interval):
            try:
                outcome, _ = self.leases.renew(
                    self.run_.job, token=self.run_.token, lease_ttl_ms=self.ttl_ms
                )
            except REDIS_ERRORS as exc:
                outcome, reason = LeaseOutcome.LOST, f"redis error: {exc}"
                lease_renewal_failed(self.run_.job, "redis_error")
            else:
                reason = outcome.value
                if outcome is not LeaseOutcome.RENEWED:
                    lease_renewal_failed(self.run_.job, "lost")
            if outcome is not LeaseOutcome.RENEWED:
                logger.warning(
                    "lease of %s could not be renewed (%s); cancellation requested",
                    self.run_.job,
                    reason,
                    extra={"event": "jobs.lease_lost", "job": self.run_.job},
                )
                self.run_.cancel.set()
                return


def _log_run(event: str, job: str, point_ms: int, outcome: str, level: int = logging.INFO) -> None:
    logger.log(
        level,
        "job run job=%s point_ms=%d outcome=%s",
        job,
        point_ms,
        outcome,
        extra={"event": event, "job": job, "outcome": outcome},
    )


def run_point(
    jobs: JobSet,
    leases: JobLeases,
    *,
    job: str,
    point_ms: int,
    period_end_ms: int,
    token: str,
    lease_ttl_ms: int,
    now_ms: int | None = None,
    registry: RunRegistry = REGISTRY,
) -> RunOutcome:
    """Check, run and release one admitted point; never raises for handler errors."""
    found = jobs.get(job)
    if found is None or not found.enabled:
        _log_run("jobs.run_unknown", job, point_ms, RunOutcome.SKIPPED_UNKNOWN_JOB, logging.ERROR)
        _release(leases, job, token)
        return RunOutcome.SKIPPED_UNKNOWN_JOB
    refused = _start_check(leases, job, point_ms, period_end_ms, token, lease_ttl_ms, now_ms)
    if refused is not None:
        return refused
    run = _Run(job=job, token=token, cancel=threading.Event())
    registry.add(run)
    renewer = _Renewer(leases, run, lease_ttl_ms)
    renewer.start()
    ctx = JobContext(
        name=job,
        scheduled_for=from_ms(point_ms),
        cancel_requested=run.cancel,
        logger=logging.getLogger(f"platform_tasks.jobs.{job}"),
    )
    outcome = RunOutcome.SUCCEEDED
    _log_run("jobs.run_started", job, point_ms, "started")
    check_in = monitoring.run_started(job, found.definition)
    try:
        found.definition.handler(ctx)
    except Exception as exc:
        outcome = RunOutcome.FAILED
        logger.error(
            "job %s failed: %s",
            job,
            exc,
            exc_info=True,
            extra={"event": "jobs.run_failed", "job": job},
        )
        monitoring.run_failed(job, exc)
    finally:
        renewer.stopped.set()
        renewer.join(timeout=5)
        _release(leases, job, token)
        registry.remove(run)
    monitoring.run_finished(check_in, succeeded=outcome is RunOutcome.SUCCEEDED)
    _log_run("jobs.run_finished", job, point_ms, outcome)
    return outcome


def _start_check(
    leases: JobLeases,
    job: str,
    point_ms: int,
    period_end_ms: int,
    token: str,
    lease_ttl_ms: int,
    now_ms: int | None,
) -> RunOutcome | None:
    """Renew the lease for the run's start: the outcome of a start refused, else ``None``.

    A point whose period ended (late) or whose lease another holder took (lost) is skipped;
    so is one whose check Redis could not answer: a job never runs without coordination.
    """
    try:
        start, _ = leases.renew(
            job,
            token=token,
            lease_ttl_ms=lease_ttl_ms,
            deadline_ms=period_end_ms,
            reacquire=True,
            now_ms=now_ms,
        )
    except REDIS_ERRORS as exc:
        logger.warning(
            "start check of %s failed: %s",
            job,
            exc,
            extra={"event": "jobs.start_check_error", "job": job},
        )
        _log_run("jobs.run_skipped", job, point_ms, RunOutcome.SKIPPED_REDIS_ERROR)
        return RunOutcome.SKIPPED_REDIS_ERROR
    if start is LeaseOutcome.LATE:
        _log_run("jobs.run_skipped", job, point_ms, RunOutcome.SKIPPED_LATE)
        return RunOutcome.SKIPPED_LATE
    if start is LeaseOutcome.LOST:
        _log_run("jobs.run_skipped", job, point_ms, RunOutcome.SKIPPED_LEASE_LOST)
        return RunOutcome.SKIPPED_LEASE_LOST
    return None


def _release(leases: JobLeases, job: str, token: str) -> None:
    try:
        leases.release(job, token=token)
    except REDIS_ERRORS as exc:
        logger.warning(
            "could not release the lease of %s (it expires by itself): %s",
            job,
            exc,
            extra={"event": "jobs.release_error", "job": job},
        )


def lease_ttl_ms(ttl: timedelta) -> int:
    return ttl // timedelta(milliseconds=1)
