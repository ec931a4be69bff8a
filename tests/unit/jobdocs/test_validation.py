"""Known values break the same rules beat enforces at start-up; check reports them all."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from platform_tasks.jobdocs import build_report, load_docs_config
from tests.unit.jobdocs.conftest import job_source, report_for

MakeProject = Callable[..., Path]


def test_every_rule_is_reported_with_file_and_field() -> None:
    rendered = sorted(problem.render() for problem in report_for("invalid").errors)

    assert rendered == [
        "error: beat_schedules/bad_cron.py: cron: '61 * * * *' is not a valid 5-field cron "
        "expression",
        "error: beat_schedules/bad_name.py: name: 'billing{eu}' must not contain braces (they "
        "delimit Redis hash tags)",
        "error: beat_schedules/bad_timezone.py: timezone: 'Mars/Olympus_Mons' is not a known "
        "IANA timezone",
        "error: beat_schedules/bad_types.py: enabled: 'yes' is not a boolean",
        "error: beat_schedules/bad_types.py: interval: 15 is not a timedelta",
        "error: beat_schedules/bad_types.py: lease_ttl: lease_ttl must be at least 1 second, "
        "got 0:00:00",
        "error: beat_schedules/both.py: both cron and interval are given; exactly one is required",
        "error: beat_schedules/dup_a.py: name: duplicate name 'duplicate', also in "
        "beat_schedules/dup_b.py:8",
        "error: beat_schedules/dup_b.py: name: duplicate name 'duplicate', also in "
        "beat_schedules/dup_a.py:8",
        "error: beat_schedules/empty.py: no call to platform_tasks.jobs.define_job; every "
        "selected file must define exactly one job",
        "error: beat_schedules/interval_with_timezone.py: timezone: timezone applies to cron "
        "schedules only",
        "error: beat_schedules/neither.py: neither cron nor interval is given; exactly one is "
        "required",
        "error: beat_schedules/never.py: cron: '0 0 30 2 *' has no representable future point",
        "error: beat_schedules/two.py: 2 definitions (lines 8, 9); exactly one allowed",
    ]


def test_several_definitions_are_all_documented() -> None:
    report = report_for("invalid")

    names = [job.fields["name"].value for job in report.jobs if job.file.endswith("two.py")]
    assert names == ["two.first", "two.second"]


def test_default_names_take_part_in_the_unique_name_check(make_project: MakeProject) -> None:
    project = make_project(
        {
            "beat_schedules/nightly.py": job_source('cron="0 1 * * *"'),
            "beat_schedules/other.py": job_source('cron="0 2 * * *", name="nightly"'),
        }
    )

    errors = report_for(project).errors
    assert sorted((p.file, p.field, p.message) for p in errors) == [
        (
            "beat_schedules/nightly.py",
            "name",
            "duplicate name 'nightly', also in beat_schedules/other.py:6",
        ),
        (
            "beat_schedules/other.py",
            "name",
            "duplicate name 'nightly', also in beat_schedules/nightly.py:6",
        ),
    ]


def test_disabled_definition_with_impossible_cron_is_not_an_error(
    make_project: MakeProject,
) -> None:
    project = make_project(
        {"beat_schedules/never.py": job_source('cron="0 0 30 2 *", enabled=False')}
    )

    assert report_for(project).errors == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_job_lists_its_violations_in_rule_order(make_project: MakeProject, workers: int) -> None:
    """Cron checks run after the files are read (in one process, however many read them);
    their message still takes the cron rule's place among the job's reasons."""
    bad = (
        "name='dup licate', cron='61 * * * *', timezone='Mars/Base', "
        "lease_ttl=timedelta(seconds=0), queue=''"
    )
    project = make_project(
        {
            "beat_schedules/a.py": "from datetime import timedelta\n" + job_source(bad),
            "beat_schedules/b.py": "from datetime import timedelta\n" + job_source(bad),
        }
    )

    config = load_docs_config(project, "development", {})
    reasons = [job.reasons for job in build_report(config, workers=workers).jobs]

    expected = [
        "name: 'dup licate' is not a non-empty string without spaces",
        "cron: '61 * * * *' is not a valid 5-field cron expression",
        "lease_ttl: lease_ttl must be at least 1 second, got 0:00:00",
        "timezone: 'Mars/Base' is not a known IANA timezone",
        "queue: '' is not a non-empty string",
    ]
    assert reasons == [
        [*expected, "name: duplicate name 'dup licate', also in beat_schedules/b.py:7"],
        [*expected, "name: duplicate name 'dup licate', also in beat_schedules/a.py:7"],
    ]
