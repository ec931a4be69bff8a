"""Scheduled job definitions live under ``schedules``; the old ``jobs`` names still work
for this release and say on stderr where the command went, stdout unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from platform_tasks.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "jobdocs"
NOTICE = "notice: `platform-tasks jobs docs` is now `platform-tasks schedules docs`"


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_old_jobs_docs_prints_the_same_document_and_a_notice() -> None:
    project = str(FIXTURES / "constants")
    new = _run("schedules", "docs", "--project", project, "--format", "json")
    old = _run("jobs", "docs", "--project", project, "--format", "json")
    assert new[0] == old[0] == 0
    assert json.loads(old[1]) == json.loads(new[1])
    assert NOTICE in old[2]
    assert "notice" not in new[2]


def test_old_jobs_check_keeps_its_exit_code_and_names_the_new_command() -> None:
    code, _, err = _run("jobs", "check", "--static", "--project", str(FIXTURES / "invalid"))
    assert code == 1
    assert "is now `platform-tasks schedules check`" in err


def test_jobs_list_without_a_correlation_id_is_the_schedule_listing_with_a_notice(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(
        main,
        ["jobs", "list", "--format", "json"],
        env={"PLATFORM_JOBS_DIR": str(tmp_path), "PLATFORM_PROFILE": "development"},
    )
    assert "is now `platform-tasks schedules list`" in result.stderr
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []


def test_jobs_show_refuses_an_id_that_is_not_a_uuid() -> None:
    result = CliRunner().invoke(
        main,
        ["jobs", "show", "not-a-job"],
        env={"PLATFORM_DATABASE_URL": "postgresql://127.0.0.1:1/none"},
    )
    assert result.exit_code == 2
    assert "job id 'not-a-job' is not a UUID" in result.stderr
