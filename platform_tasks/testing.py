"""pytest helpers for scheduled jobs: explicit ticks against a real Redis.

``JobTestScheduler`` discovers a jobs folder exactly like beat and runs the production
rule code (points, the admission script, the runner with its start check and lease) with
one deliberate seam: the scripts judge by the tick's ``at`` instead of Redis ``TIME``.

    def test_nightly(job_scheduler):
        scheduler = job_scheduler("beat_schedules", started_at=datetime(2025, 1, 1, tzinfo=UTC))
        results = scheduler.tick(at=datetime(2025, 1, 2, tzinfo=UTC))
        assert [r.outcome for r in results] == ["admitted"]

The ``job_scheduler`` fixture (registered through the ``pytest11`` entry point) is a
factory; it connects to ``job_scheduler_redis_url`` (override that fixture, default
``PLATFORM_REDIS_URL``) and closes every scheduler at teardown. Apps built with
:func:`create_test_app` schedule nothing, in beat or in a worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from platform_tasks.jobs.discovery import JobSet, discover_jobs
from platform_tasks.jobs.runner import RunOutcome, run_point
from platform_tasks.jobs.trigger import PointOutcome, PointResult, TriggerEngine
from platform_tasks.keys import jobs_namespace
from platform_tasks.leases import JobLeases

__all__ = ["JobTestScheduler", "TickResult", "create_test_app", "job_scheduler"]


def create_test_app(name: str, **kwargs: Any) -> Any:
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

    ``started_at`` is the start-up instant (only points strictly after it are due);
    ``run=False`` on :meth:`tick` admits without running, holding the leases until
    :meth:`finish` runs them, which is how overlapping runs are tested.
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
            self.jobs, self.leases, owner=owner, started_at=start, explicit_now=True
        )
        self.held: list[PointResult] = []
        self._last: datetime = start

    def tick(self, *, at: datetime, run: bool = True) -> list[TickResult]:
        """Consider every point due at ``at``; run admitted handlers inline."""
        if at.tzinfo is None:
            raise ValueError("at must be timezone-aware")
        self._last = at
        results: list[TickResult] = []
        for result in self.engine.tick(at):
            outcome: RunOutcome | None = None
            if result.outcome is PointOutcome.ADMITTED:
                if run:
                    outcome = self._run(result, at)
                else:
                    self.held.append(result)
            results.append(TickResult(result.job, result.point, result.outcome.value,
                                      outcome.value if outcome else None))  # fmt: skip
        return results

    def finish(self, *, at: datetime | None = None) -> list[TickResult]:
        """Run the points admitted with ``run=False`` (their start check judged at ``at``)."""
        when = at or self._last
        held, self.held = self.held, []
        return [TickResult(r.job, r.point, r.outcome.value, self._run(r, when).value) for r in held]

    def _run(self, result: PointResult, at: datetime) -> RunOutcome:
        assert result.token is not None
        return run_point(
            self.jobs, self.leases, job=result.job, point_ms=result.point_ms,
            period_end_ms=result.period_end_ms, token=result.token,
            lease_ttl_ms=result.lease_ttl // timedelta(milliseconds=1),
            now_ms=int(at.timestamp() * 1000),
        )  # fmt: skip

    def next_point(self, job: str) -> datetime:
        return self.engine.pending[job]


@pytest.fixture
def job_scheduler_redis_url() -> str:
    """Redis for :func:`job_scheduler`; override to point at your test Redis."""
    url = os.environ.get("PLATFORM_REDIS_URL")
    if not url:
        pytest.fail("job_scheduler needs PLATFORM_REDIS_URL or a job_scheduler_redis_url fixture")
    return url


@pytest.fixture
def job_scheduler(
    job_scheduler_redis_url: str,
) -> Iterator[Callable[..., JobTestScheduler]]:
    """Factory ``job_scheduler(jobs_dir, **options)`` of :class:`JobTestScheduler`."""
    client = redis.Redis.from_url(job_scheduler_redis_url)

    def make(jobs_dir: str | Path, **options: Any) -> JobTestScheduler:
        return JobTestScheduler(jobs_dir=jobs_dir, redis=client, **options)

    try:
        yield make
    finally:
        client.close()
