"""The pytest fixtures of the installed plugin, exercised by a real pytest run in a
temporary project: ``job_scheduler`` is a ready ``JobTestScheduler`` for the project's
jobs, ``job_scheduler_factory`` makes others, and ticks follow the contract (an admitted
point ticked again is ``skipped_duplicate``; nothing at or before start-up; no catch-up).
"""

from __future__ import annotations

from pathlib import Path

import redis

from tests.integration.testing.pytest_project import run_pytest, write_project

HOURLY = """
from datetime import timedelta
from platform_tasks.jobs import define_job

def run(ctx):
    ctx.logger.info("hourly ran")

job = define_job(handler=run, interval=timedelta(hours=1))
"""

NIGHTLY = """
from platform_tasks.jobs import define_job

def run(ctx):
    pass

job = define_job(handler=run, cron="30 2 * * *", timezone="Europe/Berlin")
"""

READY_FIXTURE_TESTS = """
from datetime import UTC, datetime, timedelta

import pytest

from platform_tasks.testing import JobTestScheduler


def test_the_fixture_is_a_ready_scheduler_for_the_project_jobs(job_scheduler):
    assert isinstance(job_scheduler, JobTestScheduler)
    assert sorted(job.name for job in job_scheduler.jobs) == ["billing.nightly", "hourly"]
    started = job_scheduler.started_at
    assert abs(datetime.now(UTC) - started) < timedelta(minutes=5), "started now"
    assert job_scheduler.next_point("hourly") > started


def test_an_admitted_point_ticked_again_is_a_duplicate(job_scheduler):
    point = job_scheduler.next_point("hourly")
    results = [(r.job, r.outcome, r.run) for r in job_scheduler.tick(at=point)]
    assert ("hourly", "admitted", "succeeded") in results
    again = {r.job: (r.point, r.outcome, r.run) for r in job_scheduler.tick(at=point)}
    assert again["hourly"] == (point, "skipped_duplicate", None)
    later = point + timedelta(minutes=59)
    assert {r.job: r.outcome for r in job_scheduler.tick(at=later)}["hourly"] == (
        "skipped_duplicate"
    )


class TestFromAFixedStart:
    @pytest.fixture
    def job_scheduler_started_at(self):
        return datetime(2025, 1, 1, 0, 10, tzinfo=UTC)

    def test_nothing_at_or_before_start_up_is_admitted(self, job_scheduler):
        # 00:00 is the hourly job's current point until 01:00, but it precedes start-up
        assert job_scheduler.tick(at=datetime(2025, 1, 1, 0, 10, tzinfo=UTC)) == []
        assert job_scheduler.tick(at=datetime(2025, 1, 1, 0, 59, tzinfo=UTC)) == []

    def test_no_catch_up(self, job_scheduler):
        results = job_scheduler.tick(at=datetime(2025, 1, 1, 3, 20, tzinfo=UTC))
        hourly = [(r.point.hour, r.outcome) for r in results if r.job == "hourly"]
        assert hourly == [(1, "skipped_late"), (2, "skipped_late"), (3, "admitted")]
        nightly = [(r.point, r.outcome) for r in results if r.job == "billing.nightly"]
        # 02:30 Berlin (01:30 UTC) is still the nightly's current point: within its period
        assert nightly == [(datetime(2025, 1, 1, 1, 30, tzinfo=UTC), "admitted")]

    def test_each_test_starts_from_empty_keys(self, job_scheduler):
        # the same point as in test_no_catch_up: admitted again, so no key survived
        results = job_scheduler.tick(at=datetime(2025, 1, 1, 3, 0, tzinfo=UTC))
        assert [(r.job, r.outcome) for r in results if r.point.hour == 3] == [
            ("hourly", "admitted")
        ]


def test_the_factory_takes_other_folders_and_start_times(job_scheduler_factory):
    start = datetime(2025, 6, 1, tzinfo=UTC)
    first = job_scheduler_factory("other_jobs", started_at=start, owner="a")
    second = job_scheduler_factory("other_jobs", started_at=start, owner="b")
    assert [job.name for job in first.jobs] == ["every_minute"]
    at = datetime(2025, 6, 1, 0, 1, tzinfo=UTC)
    assert [r.outcome for r in first.tick(at=at)] == ["admitted"]
    # the schedulers of one test are replicas of one deployment
    assert [r.outcome for r in second.tick(at=at)] == ["skipped_duplicate"]
"""

EVERY_MINUTE = """
from datetime import timedelta
from platform_tasks.jobs import define_job

def run(ctx):
    pass

define_job(handler=run, interval=timedelta(minutes=1))
"""

JOBS_DIR_TESTS = """
def test_the_fixture_reads_platform_jobs_dir(job_scheduler):
    assert [job.name for job in job_scheduler.jobs] == ["every_minute"]
"""


def test_plugin_fixtures_in_a_real_pytest_run(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    project = write_project(
        tmp_path,
        redis_url=redis_url,
        jobs={"hourly.py": HOURLY, "billing/nightly.py": NIGHTLY},
        tests={"test_jobs.py": READY_FIXTURE_TESTS},
    )
    write_project(
        project,
        redis_url=redis_url,
        jobs={"every_minute.py": EVERY_MINUTE},
        tests={},
        jobs_folder="other_jobs",
    )
    outcome = run_pytest(project)
    assert (outcome.passed, outcome.failed, outcome.errors) == (6, 0, 0), outcome.output
    assert redis_client.keys("*") == [], "the fixtures delete their keys"


def test_job_scheduler_follows_platform_jobs_dir(tmp_path: Path, redis_url: str) -> None:
    project = write_project(
        tmp_path,
        redis_url=redis_url,
        jobs={"every_minute.py": EVERY_MINUTE},
        tests={"test_dir.py": JOBS_DIR_TESTS},
        jobs_folder="scheduled",
    )
    outcome = run_pytest(project, env={"PLATFORM_JOBS_DIR": "scheduled"})
    assert (outcome.passed, outcome.failed, outcome.errors) == (1, 0, 0), outcome.output
