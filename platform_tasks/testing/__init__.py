"""pytest helpers: scheduled jobs driven by explicit ticks, and consumers run by a real
worker (the ``platform_*`` fixtures of :mod:`platform_tasks.testing.consumer`).

``JobTestScheduler`` discovers a jobs folder exactly like beat and runs the production
rule code (points, the admission script, the runner with its start check and lease) with
one deliberate seam: the scripts judge by the tick's ``at`` instead of Redis ``TIME``.
Each ``tick(at=...)`` considers every job's current point at ``at`` (the newest point at
or before ``at``), so ticking an admitted point again reports it ``skipped_duplicate``;
no point at or before the scheduler's start-up is ever admitted, and nothing missed is
caught up (older points of a period already over are reported ``skipped_late``).

    def test_nightly(job_scheduler):          # the project's jobs, started now
        point = job_scheduler.next_point("billing.nightly")
        [result] = job_scheduler.tick(at=point)
        assert (result.outcome, result.run) == ("admitted", "succeeded")
        [again] = job_scheduler.tick(at=point)
        assert again.outcome == "skipped_duplicate"

Fixtures (registered through the ``pytest11`` entry point):

* ``job_scheduler``: a ready :class:`JobTestScheduler` for the project's jobs
  (``PLATFORM_JOBS_DIR``, default ``beat_schedules``, with ``PLATFORM_JOBS_INCLUDE`` /
  ``PLATFORM_JOBS_EXCLUDE``), started at ``job_scheduler_started_at`` (default: now).
* ``job_scheduler_factory``: ``job_scheduler_factory(jobs_dir, started_at=..., ...)``
  for other folders and start times; the schedulers of one test share a namespace, so
  two of them behave as two beat replicas.
* ``platform_*`` (``platform_redis_url``, ``platform_database_url``, ``platform_app``,
  ``platform_worker``, ``platform_jobs``...): consumers run by Celery's embedded test
  worker against real servers; see :mod:`platform_tasks.testing.consumer`.

The job scheduler fixtures connect to ``job_scheduler_redis_url`` (override that fixture, default
``PLATFORM_REDIS_URL``), use a key namespace of their own per test and delete their keys
at teardown. Apps built with :func:`create_test_app` schedule nothing, in beat or in a
worker.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from platform_tasks.epoch import epoch_ms
from platform_tasks.jobs.discovery import JobSet, discover_jobs
from platform_tasks.jobs.leases import JobLeases
from platform_tasks.jobs.runner import RunOutcome, run_point
from platform_tasks.jobs.trigger import PointOutcome, PointResult, TriggerEngine
from platform_tasks.keys import jobs_namespace
from platform_tasks.testing.consumer import (
    PlatformJobs,
    platform_app,
    platform_celery_app,
    platform_database_url,
    platform_db,
    platform_environment,
    platform_jobs,
    platform_redis_url,
    platform_servers_dir,
    platform_settings,
    platform_truncate_tables,
    platform_worker,
    platform_worker_parameters,
)
from platform_tasks.testing.outcomes import JobOutcome

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "JobOutcome",
    "JobTestScheduler",
    "PlatformJobs",
    "TickResult",
    "create_test_app",
    "job_scheduler",
    "job_scheduler_factory",
    "job_scheduler_started_at",
    "platform_app",
    "platform_celery_app",
    "platform_database_url",
    "platform_db",
    "platform_environment",
    "platform_jobs",
    "platform_redis_url",
    "platform_servers_dir",
    "platform_settings",
    "platform_truncate_tables",
    "platform_worker",
    "platform_worker_parameters",
]


def create_test_app(name: str, **kwargs: Any) -> PlatformCelery:
    """``create_app`` for tests: the app's beat and workers schedule no job."""
    from platform_tasks.app import create_app
    from platform_tasks.jobs.runtime import mark_test_app

    app = create_app(name, **kwargs)
    mark_test_app(app)
    return app


@dataclass(frozen=True)
class TickResult:
    """One considered point: ``outcome`` is a :class:`PointOutcome` value
    (``admitted``, ``skipped_overlap``, ``skipped_duplicate``, ``skipped_late``...);
    ``run`` is the handler's outcome when it ran inline."""

    job: str
    point: datetime
    outcome: str
    run: str | None = None


class JobTestScheduler:
    """One beat replica driven by explicit ticks (see the module docstring).

    ``started_at`` (default now) is the start-up instant: only points strictly after it
    are ever considered. Ticks move forward in time. ``run=False`` on :meth:`tick` admits
    without running, holding the leases until :meth:`finish` runs them, which is how
    overlapping runs are tested.
    """

    def __init__(
        self,
        *,
        jobs_dir: str | Path,
        redis: Any,
        started_at: datetime | None = None,
        namespace: str | None = None,
        key_prefix: str = "",
        include: tuple[str, ...] = (),
        exclude: tuple[str, ...] = (),
        owner: str = "test-scheduler",
    ) -> None:
        start = started_at or datetime.now(UTC)
        if start.tzinfo is None:
            raise ValueError("started_at must be timezone-aware")
        self.jobs: JobSet = discover_jobs(
            Path(jobs_dir), include=include, exclude=exclude, now=start
        )
        ns = namespace or jobs_namespace(app_name="tests", profile="test", mode="test")
        self.leases = JobLeases(redis, namespace=ns, prefix=key_prefix)
        self.engine = TriggerEngine(
            self.jobs,
            self.leases,
            owner=owner,
            started_at=start,
            explicit_now=True,
            reconsider_current=True,
        )
        self.started_at = start
        self.held: list[PointResult] = []
        self._last: datetime = start

    def tick(self, *, at: datetime, run: bool = True) -> list[TickResult]:
        """Consider every job's current point at ``at``; run admitted handlers inline.

        One result per considered point: the current point of each job whose current
        point is after start-up (``admitted``, ``skipped_overlap``, ``skipped_duplicate``
        when an earlier tick or another replica consumed it, ``skipped_redis_error``),
        preceded by ``skipped_late`` for the points between the previous tick and it.
        """
        if at.tzinfo is None:
            raise ValueError("at must be timezone-aware")
        if at < self._last:
            raise ValueError(
                f"ticks move forward: {at.isoformat()} is before {self._last.isoformat()}"
            )
        self._last = at
        results: list[TickResult] = []
        for result in self.engine.tick(at):
            outcome: RunOutcome | None = None
            if result.outcome is PointOutcome.ADMITTED:
                if run:
                    outcome = self._run(result, at)
                else:
                    self.held.append(result)
            results.append(
                TickResult(
                    result.job,
                    result.point,
                    result.outcome.value,
                    outcome.value if outcome else None,
                )
            )
        return results

    def finish(self, *, at: datetime | None = None) -> list[TickResult]:
        """Run the points admitted with ``run=False`` (their start check judged at ``at``)."""
        when = at or self._last
        held, self.held = self.held, []
        return [TickResult(r.job, r.point, r.outcome.value, self._run(r, when).value) for r in held]

    def _run(self, result: PointResult, at: datetime) -> RunOutcome:
        assert result.token is not None
        return run_point(
            self.jobs,
            self.leases,
            job=result.job,
            point_ms=result.point_ms,
            period_end_ms=result.period_end_ms,
            token=result.token,
            lease_ttl_ms=result.lease_ttl // timedelta(milliseconds=1),
            now_ms=epoch_ms(at),
        )

    def next_point(self, job: str) -> datetime:
        """The job's next point not yet considered (the first after start-up, at first)."""
        return self.engine.pending[job]

    def delete_keys(self) -> None:
        """Delete the markers and leases of this scheduler's jobs from Redis."""
        names = [key for job in self.jobs for key in self._keys_of(job.name)]
        if names:
            self.leases.client.delete(*names)

    def _keys_of(self, job: str) -> tuple[str, str]:
        keys = self.leases.keys(job)
        return keys.marker, keys.lease


@pytest.fixture
def job_scheduler_redis_url() -> str:
    """Redis for the job scheduler fixtures; override to point at your test Redis."""
    url = os.environ.get("PLATFORM_REDIS_URL")
    if not url:
        pytest.fail("job_scheduler needs PLATFORM_REDIS_URL or a job_scheduler_redis_url fixture")
    return url


@pytest.fixture
def job_scheduler_started_at() -> datetime:
    """Start-up instant of :func:`job_scheduler` (default now); override for a fixed one."""
    return datetime.now(UTC)


@pytest.fixture
def job_scheduler_factory(
    job_scheduler_redis_url: str,
) -> Iterator[Callable[..., JobTestScheduler]]:
    """``job_scheduler_factory(jobs_dir, **options)``: a :class:`JobTestScheduler` for
    any folder and start time (``started_at=``, ``owner=``, ``include=``...).

    The schedulers of one test share a key namespace of their own (two of them act as
    two replicas of one deployment); their keys are deleted at teardown.
    """
    client = redis.Redis.from_url(job_scheduler_redis_url)
    namespace = f"{jobs_namespace(app_name='tests', profile='test', mode='test')}:{uuid.uuid4()}"
    made: list[JobTestScheduler] = []

    def make(jobs_dir: str | Path, **options: Any) -> JobTestScheduler:
        options.setdefault("namespace", namespace)
        scheduler = JobTestScheduler(jobs_dir=jobs_dir, redis=client, **options)
        made.append(scheduler)
        return scheduler

    try:
        yield make
    finally:
        try:
            for scheduler in made:
                scheduler.delete_keys()
        finally:
            client.close()


@pytest.fixture
def job_scheduler(
    job_scheduler_factory: Callable[..., JobTestScheduler], job_scheduler_started_at: datetime
) -> JobTestScheduler:
    """A ready :class:`JobTestScheduler` for the project's jobs: ``PLATFORM_JOBS_DIR``
    (default ``beat_schedules``, relative to the working directory, as beat reads it)
    with ``PLATFORM_JOBS_INCLUDE`` / ``PLATFORM_JOBS_EXCLUDE``, started at
    ``job_scheduler_started_at``."""
    from platform_tasks.settings import PlatformSettings

    settings = PlatformSettings.from_env()
    if not settings.jobs_dir.is_dir():
        pytest.fail(
            f"job_scheduler: jobs folder {settings.jobs_dir} not found (the working "
            "directory is the project root, or set PLATFORM_JOBS_DIR)"
        )
    return job_scheduler_factory(
        settings.jobs_dir,
        started_at=job_scheduler_started_at,
        include=tuple(settings.jobs_include),
        exclude=tuple(settings.jobs_exclude),
    )
