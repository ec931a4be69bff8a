"""The Markdown page reads well: state, a row per job, defaults and unknowns labelled."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from platform_tasks.jobdocs import render_markdown
from tests.unit.jobdocs.conftest import job_source, report_for


def test_page_structure_and_rows() -> None:
    page = render_markdown(report_for("direct_import"))
    lines = page.splitlines()

    assert lines[0] == "# Scheduled jobs"
    assert "`runtime_verified: false`" in lines[2]
    assert "## Project state: `active`" in lines
    assert "## Jobs" in lines
    assert (
        "| `billing.sweep` | `billing.every_fifteen` | every 15m | `UTC` (default) | no | 5m "
        "| `billing.jobs` | `beat_schedules/billing/every_fifteen.py` | complete |"
    ) in lines
    assert (
        "| `nightly` (default) | `nightly` | cron `0 3 * * *` | `Europe/Berlin` | yes (default) "
        "| the period, capped at 1h (default) | `platform.jobs` (default) "
        "| `beat_schedules/nightly.py` | complete |"
    ) in lines


def test_unknown_name_is_shown_as_unknown_next_to_the_path_label() -> None:
    lines = render_markdown(report_for("unknown_name")).splitlines()

    [row] = [line for line in lines if "named_at_runtime.py` |" in line]
    assert row.startswith("| *unknown* | `billing.named_at_runtime` | cron `0 6 * * *` |")
    assert row.endswith("| **missing** |")
    assert "### `beat_schedules/billing/named_at_runtime.py` (line 10)" in lines
    assert "- name: environment lookup os.environ.get('JOB_NAME')" in lines


def test_files_without_evidence_section() -> None:
    lines = render_markdown(report_for("wrapper")).splitlines()

    assert "No definitions found." in lines
    assert "## Files without evidence" in lines
    [row] = [line for line in lines if line.startswith("| `beat_schedules/cleanup.py`")]
    assert "wraps define_job" in row


def test_table_cells_escape_pipes(make_project: Callable[..., Path]) -> None:
    project = make_project({"beat_schedules/odd.py": job_source('cron="0 3 * * *", queue="a|b"')})

    [row] = [line for line in render_markdown(report_for(project)).splitlines() if "odd.py" in line]
    assert "`a\\|b`" in row
    assert row.replace("\\|", "").count("|") == 10
