"""The shipped platform jobs' schedules: documented defaults, overridable by a validated
setting (``PLATFORM_PROCESSED_JOBS_PURGE_CRON``, ``PLATFORM_DEAD_LETTER_REPORT_CRON``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from platform_tasks.errors import SettingsError
from platform_tasks.jobs.discovery import discover_jobs
from platform_tasks.settings import PlatformSettings
from tests.conftest import REPO_ROOT

SHIPPED = REPO_ROOT / "beat_schedules"
NOW = datetime(2025, 1, 1, tzinfo=UTC)
VARIABLES = ("PLATFORM_PROCESSED_JOBS_PURGE_CRON", "PLATFORM_DEAD_LETTER_REPORT_CRON")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _crons() -> dict[str, str | None]:
    """The platform's own jobs (the example app's maintenance jobs ship beside them)."""
    jobs = discover_jobs(SHIPPED, now=NOW)
    return {job.name: job.definition.cron for job in jobs if job.name.startswith("platform.")}


def test_defaults_are_the_documented_nightly_and_hourly_schedules() -> None:
    assert _crons() == {
        "platform.processed_jobs_cleanup": "17 3 * * *",
        "platform.dead_letter_age_report": "5 * * * *",
    }


def test_the_settings_change_when_the_shipped_jobs_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLATFORM_PROCESSED_JOBS_PURGE_CRON", "0  1 * * *")
    monkeypatch.setenv("PLATFORM_DEAD_LETTER_REPORT_CRON", "*/10 * * * *")
    assert _crons() == {
        "platform.processed_jobs_cleanup": "0 1 * * *",
        "platform.dead_letter_age_report": "*/10 * * * *",
    }


@pytest.mark.parametrize("variable", VARIABLES)
@pytest.mark.parametrize("value", ["* * *", "61 * * * *", "every night"])
def test_a_bad_schedule_is_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        PlatformSettings.from_env({variable: value})
    assert variable in str(caught.value) and repr(value) in str(caught.value)
