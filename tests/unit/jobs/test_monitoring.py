"""The Sentry monitor of a job: slug and configuration from its definition."""

from __future__ import annotations

from datetime import timedelta

import pytest

from platform_tasks.jobs.definition import define_job
from platform_tasks.jobs.monitoring import monitor_config, monitor_slug


def _run(ctx: object) -> None:
    return None


def test_cron_job_is_a_crontab_monitor_in_its_zone() -> None:
    definition = define_job(handler=_run, cron="30 2 * * *", timezone="Europe/Berlin")
    assert monitor_config(definition) == {
        "schedule": {"type": "crontab", "value": "30 2 * * *"},
        "timezone": "Europe/Berlin",
    }


@pytest.mark.parametrize(
    ("interval", "schedule"),
    [
        (timedelta(seconds=1), {"type": "interval", "value": 1, "unit": "minute"}),
        (timedelta(seconds=90), {"type": "interval", "value": 2, "unit": "minute"}),
        (timedelta(minutes=15), {"type": "interval", "value": 15, "unit": "minute"}),
        (timedelta(hours=2), {"type": "interval", "value": 2, "unit": "hour"}),
        (timedelta(days=1), {"type": "interval", "value": 1, "unit": "day"}),
        (timedelta(weeks=2), {"type": "interval", "value": 2, "unit": "week"}),
        (timedelta(hours=36), {"type": "interval", "value": 36, "unit": "hour"}),
    ],
)
def test_interval_is_whole_minutes_rounded_up(interval: timedelta, schedule: dict) -> None:
    definition = define_job(handler=_run, interval=interval)
    assert monitor_config(definition) == {"schedule": schedule, "timezone": "UTC"}


def test_slug_is_the_job_name_or_what_sentry_would_make_of_it() -> None:
    assert monitor_slug("processed_jobs_cleanup") == "processed_jobs_cleanup"
    assert monitor_slug("Billing.Nightly") == "billing-nightly"
    assert len(monitor_slug("x" * 80)) == 50
