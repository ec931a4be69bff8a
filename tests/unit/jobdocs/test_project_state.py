"""The project state is conservative: active only on evidence, unknown when a gap could matter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from platform_tasks.jobdocs import ProjectStateName
from tests.unit.jobdocs.conftest import job_source, report_for

MakeProject = Callable[..., Path]
PROFILES = """
[tool.platform-tasks.profiles.development]
redis_url = "redis://127.0.0.1:6379/0"

[tool.platform-tasks.profiles.production]
jobs_enabled = true

[tool.platform-tasks.profiles.paused]
jobs_enabled = false
redis_url = "redis://redis:6379/0"
"""
ACTIVE = {"beat_schedules/nightly.py": job_source('cron="0 3 * * *"')}


def test_no_jobs(make_project: MakeProject) -> None:
    project = make_project({"beat_schedules/_common.py": "X = 1\n"}, PROFILES)

    state = report_for(project).project
    assert state.state is ProjectStateName.NO_JOBS
    assert state.reasons == ["no job files selected under beat_schedules"]


def test_missing_jobs_dir_is_no_jobs_with_the_reason(make_project: MakeProject) -> None:
    state = report_for(make_project({}, PROFILES)).project

    assert state.state is ProjectStateName.NO_JOBS
    assert state.reasons == ["jobs directory beat_schedules does not exist"]


def test_all_disabled(make_project: MakeProject) -> None:
    project = make_project(
        {"beat_schedules/off.py": job_source('cron="0 3 * * *", enabled=False')}, PROFILES
    )

    assert report_for(project).project.state is ProjectStateName.ALL_DISABLED


def test_globally_disabled_by_profile_and_by_environment(make_project: MakeProject) -> None:
    project = make_project(ACTIVE, PROFILES)

    by_profile = report_for(project, profile="paused").project
    by_env = report_for(project, environ={"PLATFORM_JOBS_ENABLED": "false"}).project

    assert by_profile.state is ProjectStateName.GLOBALLY_DISABLED
    assert "jobs_enabled in [tool.platform-tasks.profiles.paused]" in by_profile.reasons[0]
    assert by_env.state is ProjectStateName.GLOBALLY_DISABLED
    assert "environment variable PLATFORM_JOBS_ENABLED" in by_env.reasons[0]


def test_active_with_redis(make_project: MakeProject) -> None:
    state = report_for(make_project(ACTIVE, PROFILES)).project

    assert state.state is ProjectStateName.ACTIVE
    assert state.reasons == [
        "jobs_enabled is true (runtime default (true))",
        "1 active definition(s): nightly",
        "Redis configured by redis_url in [tool.platform-tasks.profiles.development]",
    ]


def test_active_without_redis_in_production(make_project: MakeProject) -> None:
    project = make_project(ACTIVE, PROFILES)

    state = report_for(project, profile="production").project
    with_env = report_for(
        project, profile="production", environ={"PLATFORM_REDIS_URL": "redis://prod:6379/0"}
    ).project

    assert state.state is ProjectStateName.ACTIVE_WITHOUT_REDIS
    assert "no redis_url in [tool.platform-tasks.profiles.production]" in state.reasons[-1]
    assert with_env.state is ProjectStateName.ACTIVE


def test_undeclared_profile_is_unknown(make_project: MakeProject) -> None:
    state = report_for(make_project(ACTIVE, PROFILES), profile="staging").project

    assert state.state is ProjectStateName.UNKNOWN
    assert state.reasons[0] == (
        "jobs_enabled is not statically known: profile 'staging' is not declared in pyproject.toml"
    )


def test_unparseable_switch_is_unknown(make_project: MakeProject) -> None:
    state = report_for(
        make_project(ACTIVE, PROFILES), environ={"PLATFORM_JOBS_ENABLED": "sometimes"}
    ).project

    assert state.state is ProjectStateName.UNKNOWN


def test_unknown_enabled_without_known_active_job_is_unknown(make_project: MakeProject) -> None:
    project = make_project(
        {
            "beat_schedules/maybe.py": job_source('cron="0 3 * * *", enabled=FLAG'),
            "beat_schedules/off.py": job_source('cron="0 4 * * *", enabled=False'),
        },
        PROFILES,
    )

    state = report_for(project).project
    assert state.state is ProjectStateName.UNKNOWN
    assert state.reasons == ["enabled of maybe is not statically known"]


def test_file_without_evidence_keeps_state_unknown(make_project: MakeProject) -> None:
    project = make_project(
        {"beat_schedules/wrapped.py": "from elsewhere import make\n\nmake()\n"}, PROFILES
    )

    state = report_for(project).project
    assert state.state is ProjectStateName.UNKNOWN
    assert state.reasons == ["beat_schedules/wrapped.py has no statically known definition"]


def test_a_large_project_names_twenty_active_jobs_and_counts_the_rest(
    make_project: MakeProject,
) -> None:
    files = {f"beat_schedules/job_{i:02d}.py": job_source('cron="0 3 * * *"') for i in range(23)}

    report = report_for(make_project(files, PROFILES))

    names = ", ".join(f"job_{i:02d}" for i in range(20))
    assert report.project.reasons[1] == (
        f"23 active definition(s): {names}, and 3 more (every job is listed under jobs)"
    )
    assert len(report.jobs) == 23
