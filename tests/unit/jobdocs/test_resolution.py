"""Constants resolve inside the roots only; every gap is a reason, never a guess."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from platform_tasks.jobdocs import FieldState
from tests.unit.jobdocs.conftest import job_in, job_source, report_for


def test_constants_resolve_from_private_common_module() -> None:
    report = report_for("constants")
    nightly = job_in(report, "beat_schedules/nightly.py")
    sweep = job_in(report, "beat_schedules/sweep.py")

    assert nightly.fields["cron"].value == "0 3 * * *"
    assert nightly.fields["timezone"].value == "Europe/Berlin"
    assert sweep.fields["name"].value == "maintenance.sweep"
    assert sweep.fields["interval"].value == 900
    assert sweep.fields["lease_ttl"].value == 300
    assert sweep.fields["queue"].value == "platform.maintenance"
    assert nightly.complete and sweep.complete


def test_wrapper_function_is_missing_evidence_not_an_error() -> None:
    report = report_for("wrapper")

    assert report.jobs == []
    [item] = report.files_without_evidence
    assert item.file == "beat_schedules/cleanup.py"
    assert "nightly() defined in beat_schedules/_factory.py wraps define_job" in item.reasons[0]
    assert report.errors == []
    assert len(report.warnings) == 1


def test_import_cycle_is_reported_with_its_chain() -> None:
    job = job_in(report_for("cycle"), "beat_schedules/looped.py")

    assert job.fields["cron"].state is FieldState.UNKNOWN
    assert job.fields["cron"].value is None
    assert not job.complete
    assert job.reasons == [
        "cron: import cycle: beat_schedules._a.NIGHTLY -> beat_schedules._b.NIGHTLY"
        " -> beat_schedules._a.NIGHTLY"
    ]


def test_imports_escaping_the_roots_are_not_followed() -> None:
    report = report_for("root_escape")
    constant = job_in(report, "beat_schedules/escaping_constant.py")
    climbing = job_in(report, "beat_schedules/climbing.py")

    assert constant.fields["cron"].state is FieldState.UNKNOWN
    assert "shared.schedules.NIGHTLY is outside the source roots" in constant.reasons[0]
    assert climbing.fields["cron"].state is FieldState.UNKNOWN
    assert "climbs above" in climbing.reasons[0]
    [item] = report.files_without_evidence
    assert item.file == "beat_schedules/escaping_define_job.py"
    assert "shared.schedules.define_job is outside the source roots" in item.reasons[0]


def test_syntax_error_costs_only_its_own_file() -> None:
    report = report_for("syntax_error")

    assert [job.file for job in report.jobs] == ["beat_schedules/fine.py"]
    [item] = report.files_without_evidence
    assert item.file == "beat_schedules/broken.py"
    assert item.reasons[0].startswith("syntax error at line 3")
    assert [p.file for p in report.errors] == ["beat_schedules/broken.py"]


def test_calls_and_environment_lookups_are_unknown() -> None:
    job = job_in(report_for("unknown_field"), "beat_schedules/from_env.py")

    states = {name: field.state for name, field in job.fields.items()}
    assert states == {
        "name": FieldState.ABSENT,
        "cron": FieldState.UNKNOWN,
        "interval": FieldState.ABSENT,
        "timezone": FieldState.UNKNOWN,
        "enabled": FieldState.ABSENT,
        "lease_ttl": FieldState.ABSENT,
        "queue": FieldState.UNKNOWN,
    }
    assert job.reasons == [
        "cron: environment lookup os.environ['NIGHTLY_CRON']",
        "timezone: environment lookup os.getenv('JOB_TZ', 'UTC')",
        "queue: call pick_queue() is evaluated at import time",
    ]


def test_given_but_unknown_name_is_not_replaced_by_the_path_label() -> None:
    report = report_for("unknown_name")
    job = job_in(report, "beat_schedules/billing/named_at_runtime.py")

    assert job.fields["name"].state is FieldState.UNKNOWN
    assert job.fields["name"].value is None
    assert job.path_label == "billing.named_at_runtime"
    assert job.fields["interval"].state is FieldState.ABSENT  # interval=None is the default
    assert report.errors == []


def test_relative_import_in_a_job_file_is_an_error_not_a_value() -> None:
    # Discovery imports a job file under a generated name outside any package, so
    # ``from ._common import X`` raises at start-up; the reader must not resolve it.
    report = report_for("relative_import")
    constant = job_in(report, "beat_schedules/relative_constant.py")

    assert constant.fields["cron"].state is FieldState.UNKNOWN
    assert constant.fields["timezone"].value == "Europe/Berlin"
    assert "relative import at line 2 fails at start-up" in constant.reasons[0]
    [item] = report.files_without_evidence
    assert item.file == "beat_schedules/nested/relative_define.py"
    assert item.reasons[0].startswith("relative import at line 1 fails when discovery imports")
    errors = sorted((problem.file, problem.message) for problem in report.errors)
    assert [file for file, _ in errors] == [
        "beat_schedules/nested/relative_define.py",
        "beat_schedules/relative_constant.py",
    ]
    assert errors[0][1].startswith("relative import at line 1 fails when discovery imports")
    assert errors[1][1].startswith("relative import at line 2 fails when discovery imports")


def test_relative_imports_in_helpers_and_handlers_are_fine() -> None:
    # A helper is imported under its real name (relative imports work there), and an
    # import inside the handler runs only when the handler does.
    report = report_for("relative_import")

    via_helper = job_in(report, "beat_schedules/via_helper.py")
    assert via_helper.fields["cron"].value == "0 3 * * *"
    assert via_helper.complete
    in_handler = job_in(report, "beat_schedules/in_handler.py")
    assert in_handler.complete and in_handler.problems == []


def test_names_an_assignment_expression_binds_are_never_known(
    make_project: Callable[..., Path],
) -> None:
    """``NIGHTLY := ...`` at import time rebinds the module-level name (in a comprehension
    too); inside a function or a class body it binds a name of that scope only."""
    common = (
        'NIGHTLY = "0 3 * * *"\n'
        '(NIGHTLY := "61 * * * *")\n'
        "_ = [ZONE := z for z in ['Europe/Berlin']]\n"
        'QUEUE = "jobs.q"\n'
        "def helper():\n    QUEUE = (QUEUE2 := 1)\n    return QUEUE\n"
        "class Holder:\n    QUEUE = (INNER := 2)\n"
    )
    project = make_project(
        {
            "beat_schedules/_common.py": common,
            "beat_schedules/nightly.py": "from beat_schedules._common import NIGHTLY, ZONE, QUEUE\n"
            + job_source("cron=NIGHTLY, timezone=ZONE, queue=QUEUE"),
        },
        '[tool.platform-tasks]\nsource_roots = ["beat_schedules"]\n',
    )

    job = job_in(report_for(project), "beat_schedules/nightly.py")

    assert job.fields["cron"].state is FieldState.UNKNOWN
    assert job.fields["timezone"].state is FieldState.UNKNOWN
    assert job.fields["queue"].state is FieldState.KNOWN
    assert job.fields["queue"].value == "jobs.q"
    assert "cron: beat_schedules._common: NIGHTLY is bound 2 times at module level" in job.reasons
    assert (
        "timezone: beat_schedules._common: bound by an assignment expression (:=) at import time"
        in job.reasons
    )
