"""``platform-tasks jobs list`` imports and validates like beat."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from platform_tasks.cli import main

JOB = """
from platform_tasks.jobs import define_job
def run(ctx): pass
define_job(handler=run, cron="0 9 * * 1", timezone="Europe/Berlin")
"""


def test_list_json_shows_the_job_and_next_point(tmp_path: Path) -> None:
    (tmp_path / "weekly.py").write_text(JOB)
    result = CliRunner().invoke(main, ["jobs", "list", "--format", "json"],
                                env={"PLATFORM_JOBS_DIR": str(tmp_path)})  # fmt: skip
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    assert row["name"] == "weekly" and row["timezone"] == "Europe/Berlin"
    assert row["next_point"] is not None


def test_list_fails_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(JOB.replace("0 9 * * 1", "0 0 30 2 *"))
    result = CliRunner().invoke(main, ["jobs", "list"], env={"PLATFORM_JOBS_DIR": str(tmp_path)})
    assert result.exit_code == 1
    assert "bad.py" in result.output and "cron" in result.output
