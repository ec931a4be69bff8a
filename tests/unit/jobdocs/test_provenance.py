"""Only calls provably reaching ``platform_tasks.jobs.define_job`` are definitions."""

from __future__ import annotations

from platform_tasks.jobdocs import FieldState
from tests.unit.jobdocs.conftest import job_in, report_for


def test_direct_import_documents_every_field() -> None:
    report = report_for("direct_import")
    nightly = job_in(report, "beat_schedules/nightly.py")
    sweep = job_in(report, "beat_schedules/billing/every_fifteen.py")

    assert nightly.fields["cron"].value == "0 3 * * *"
    assert nightly.fields["timezone"].state is FieldState.KNOWN
    assert nightly.fields["name"].state is FieldState.ABSENT
    assert nightly.fields["name"].value == "nightly"
    assert sweep.path_label == "billing.every_fifteen"
    assert sweep.fields["name"].value == "billing.sweep"
    assert sweep.fields["interval"].value == 900
    assert sweep.fields["enabled"].value is False
    assert report.files_without_evidence == []


def test_alias_counts() -> None:
    job = job_in(report_for("alias"), "beat_schedules/reports.py")

    assert job.fields["interval"].value == 7200
    assert job.fields["lease_ttl"].state is FieldState.ABSENT
    assert job.fields["lease_ttl"].value == 3600  # the period, capped at one hour


def test_module_aliases_and_dotted_access_count() -> None:
    report = report_for("module_alias")

    assert sorted(job.file for job in report.jobs) == [
        "beat_schedules/as_j.py",
        "beat_schedules/dotted.py",
        "beat_schedules/from_package.py",
    ]
    assert job_in(report, "beat_schedules/dotted.py").fields["name"].value == "hourly"
    assert report.errors == []


def test_re_exports_inside_the_roots_count_absolute_relative_and_chained() -> None:
    report = report_for("reexport")

    assert [job.fields["cron"].value for job in report.jobs] == [
        "15 2 * * *",
        "45 2 * * *",
        "0 4 * * 0",
    ]
    assert report.files_without_evidence == []


def test_look_alikes_are_not_definitions() -> None:
    report = report_for("lookalike")

    assert [job.file for job in report.jobs] == ["beat_schedules/real.py"]
    assert job_in(report, "beat_schedules/real.py").fields["cron"].value == "0 2 * * *"
    without = {item.file: item.reasons for item in report.files_without_evidence}
    assert (
        "no call to platform_tasks.jobs.define_job"
        in without["beat_schedules/local_lookalike.py"][0]
    )
    assert "no call to" in without["beat_schedules/project_lookalike.py"][0]
    assert "outside the source roots" in without["beat_schedules/third_party_lookalike.py"][0]
    errors = {problem.file for problem in report.errors}
    assert errors == {"beat_schedules/local_lookalike.py", "beat_schedules/project_lookalike.py"}
    assert [w.file for w in report.warnings] == ["beat_schedules/third_party_lookalike.py"]
