"""The reader never runs project code: a module that would write a file or raise is only read."""

from __future__ import annotations

import sys

from platform_tasks.jobdocs import render_json, render_markdown
from tests.unit.jobdocs.conftest import FIXTURES, job_in, report_for

PROJECT = FIXTURES / "side_effects"
MARKERS = ("JOB_IMPORTED", "COMMON_IMPORTED", "HANDLER_RAN")


def _loaded_from_project() -> list[str]:
    return [
        name
        for name, module in list(sys.modules.items())
        if str(getattr(module, "__file__", None) or "").startswith(str(PROJECT))
    ]


def test_dangerous_module_is_documented_without_running() -> None:
    for marker in MARKERS:
        assert not (PROJECT / "beat_schedules" / marker).exists()

    report = report_for("side_effects")
    render_json(report)
    render_markdown(report)

    job = job_in(report, "beat_schedules/dangerous.py")
    assert job.fields["cron"].value == "0 3 * * *"  # resolved from _common without importing it
    assert job.complete
    for marker in MARKERS:
        assert not (PROJECT / "beat_schedules" / marker).exists()
    assert _loaded_from_project() == []
    assert "beat_schedules" not in sys.modules
    assert "beat_schedules.dangerous" not in sys.modules
    assert "beat_schedules._common" not in sys.modules
