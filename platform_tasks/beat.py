"""``LeaseScheduler``: a Celery beat scheduler any number of replicas can run at once.

Stock beat keeps its schedule in the process, so two replicas double-fire, a restart
catches up missed runs and nothing stops a run overlapping the previous one. Here every
replica discovers the same job files and, at each point, asks Redis once (the admission
script); Redis decides which replica's trigger wins, refuses catch-up and skips a point
while the job's running lease is held. Admitted points are sent to the worker as a
``platform.jobs.run`` task carrying the lease token.

The scheduler also runs a delay promoter, so durable delays keep moving in deployments
whose only long-lived process next to the workers is beat.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import beat

from platform_tasks.delay_promoter import DelayPromoter
from platform_tasks.jobs.points import from_ms
from platform_tasks.jobs.runtime import JobRuntime, app_name, runtime_mode, start_jobs
from platform_tasks.jobs.trigger import PointOutcome, PointResult, TriggerEngine
from platform_tasks.jobs.worker import RUN_TASK

__all__ = ["LeaseScheduler"]

logger = logging.getLogger("platform_tasks.beat")

_MIN_SLEEP = 0.01
# Reconnect after a broker restart, but give up quickly: the trigger is only worth
# sending within its period (the worker's start check drops it otherwise).
_PUBLISH_RETRY = {"max_retries": 3, "interval_start": 0.1, "interval_step": 0.2,
                  "interval_max": 0.5}  # fmt: skip


class LeaseScheduler(beat.Scheduler):  # type: ignore[misc]
    """Beat scheduler whose entries are the discovered jobs, admitted through Redis."""

    #: the longest beat sleeps between ticks when no point is due sooner
    max_interval = 5.0

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.runtime: JobRuntime | None = None
        self.engine: TriggerEngine | None = None
        self.promoter: DelayPromoter | None = None
        self._offset = timedelta(0)  # Redis clock minus ours
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        super().__init__(app, *args, **kwargs)

    # -- Celery hooks ------------------------------------------------------------------

    def setup_schedule(self) -> None:
        """Validate everything before the first tick; start the delay promoter."""
        settings = self.app.platform_settings
        self.runtime = start_jobs(
            settings, app_name=app_name(self.app), mode=runtime_mode(self.app), role="beat"
        )
        if self.runtime.leases is not None:
            self.engine = TriggerEngine(
                self.runtime.jobs, self.runtime.leases, owner=self.owner,
                started_at=self.runtime.ready_at,
            )  # fmt: skip
            self._offset = self.runtime.ready_at - datetime.now(UTC)
        self.promoter = DelayPromoter(settings, name="platform-beat-delay-promoter")
        self.promoter.start()
        logger.info(
            "beat scheduler ready owner=%s ready_at_ms=%d active_jobs=%d", self.owner,
            int(self.runtime.ready_at.timestamp() * 1000),
            len(self.engine.jobs) if self.engine else 0,
            extra={"event": "beat.ready"},
        )  # fmt: skip

    def now(self) -> datetime:
        """Our best estimate of the Redis clock (local clock plus the measured offset)."""
        return datetime.now(UTC) + self._offset

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Trigger every due point; return seconds until the next one (capped)."""
        if self.engine is None:
            return float(self.max_interval)
        for result in self.engine.tick(self.now()):
            if result.judged_at_ms is not None:
                self._offset = from_ms(result.judged_at_ms) - datetime.now(UTC)
            if result.outcome is PointOutcome.ADMITTED:
                self._dispatch(result)
        next_due = self.engine.next_due()
        if next_due is None:
            return float(self.max_interval)
        wait = (next_due - self.now()).total_seconds()
        return min(float(self.max_interval), max(_MIN_SLEEP, wait))

    def _dispatch(self, result: PointResult) -> None:
        assert self.engine is not None and self.runtime is not None
        job = self.engine.jobs[result.job]
        assert result.token is not None
        try:
            self.app.send_task(
                RUN_TASK,
                kwargs={
                    "job": result.job,
                    "point_ms": result.point_ms,
                    "period_end_ms": result.period_end_ms,
                    "token": result.token,
                    "lease_ttl_ms": result.lease_ttl // timedelta(milliseconds=1),
                },
                queue=job.definition.queue,
                producer=self.producer,
                retry=True,
                retry_policy=_PUBLISH_RETRY,
            )
        except Exception as exc:
            # The lease would block the job for lease_ttl; it is ours, so give it back.
            logger.error(
                "could not send trigger of %s: %s", result.job, exc,
                extra={"event": "beat.dispatch_failed", "job": result.job},
            )  # fmt: skip
            if self.runtime.leases is not None:
                try:
                    self.runtime.leases.release(result.job, token=result.token)
                except Exception as release_exc:
                    logger.warning("lease release failed: %s", release_exc,
                                   extra={"event": "beat.release_failed"})  # fmt: skip

    def sync(self) -> None:
        """Nothing to persist: Redis holds all shared state."""

    def close(self) -> None:
        """Stop triggering, stop the promoter, close what we own (not a passed-in client)."""
        self.engine = None
        if self.promoter is not None:
            self.promoter.stop()
            self.promoter = None
        if self.runtime is not None:
            self.runtime.close()
        logger.info("beat scheduler closed", extra={"event": "beat.closed"})
        super().close()

    @property
    def info(self) -> str:
        count = len(self.engine.jobs) if self.engine else 0
        return f"    . platform lease scheduler: {count} active job(s)"
