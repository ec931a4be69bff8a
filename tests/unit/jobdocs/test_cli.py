"""``platform-tasks jobs docs`` and ``jobs check --static`` through click and the real script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from platform_tasks.cli import main
from tests.unit.jobdocs.conftest import FIXTURES, GOLDEN

SCRIPT = Path(sys.executable).parent / "platform-tasks"


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_docs_json_to_stdout_matches_golden() -> None:
    code, out, _ = _invoke(
        "schedules", "docs", "--project", str(FIXTURES / "constants"), "--format", "json"
    )

    assert code == 0
    assert out == (GOLDEN / "constants.json").read_text()


def test_docs_markdown_to_output_file(tmp_path: Path) -> None:
    target = tmp_path / "jobs.md"

    code, out, _ = _invoke(
        "schedules", "docs", "--project", str(FIXTURES / "alias"), "--output", str(target)
    )

    assert code == 0
    assert out == ""
    assert target.read_text().startswith("# Scheduled jobs\n")


def test_docs_selection_flags_override_settings() -> None:
    code, out, _ = _invoke(
        "schedules",
        "docs",
        "--project",
        str(FIXTURES / "invalid"),
        "--format",
        "json",
        "--include",
        "dup_*",
        "--exclude",
        "*_b.py",
    )

    assert code == 0
    assert [job["file"] for job in json.loads(out)["jobs"]] == ["beat_schedules/dup_a.py"]


def test_docs_warns_about_missing_evidence_on_stderr() -> None:
    code, _, err = _invoke("schedules", "docs", "--project", str(FIXTURES / "cycle"))

    assert code == 0
    assert err.startswith("warning: beat_schedules/looped.py: cron: import cycle:")


def test_check_passes_on_a_clean_project() -> None:
    code, out, err = _invoke(
        "schedules", "check", "--static", "--project", str(FIXTURES / "reexport")
    )

    assert code == 0
    assert err == ""
    assert "3 definition(s) in 3 file(s)" in out
    assert "0 error(s), 0 warning(s)" in out


def test_check_passes_with_warnings_only() -> None:
    code, out, err = _invoke(
        "schedules", "check", "--static", "--project", str(FIXTURES / "wrapper")
    )

    assert code == 0
    assert "wraps define_job" in err
    assert "0 error(s), 1 warning(s)" in out


def test_check_fails_on_errors() -> None:
    code, out, err = _invoke(
        "schedules", "check", "--static", "--project", str(FIXTURES / "invalid")
    )

    assert code == 1
    assert "error: beat_schedules/bad_cron.py: cron: '61 * * * *'" in err
    assert "14 error(s)" in out


def test_check_without_static_is_a_usage_error() -> None:
    code, _, err = _invoke("schedules", "check", "--project", str(FIXTURES / "reexport"))

    assert code == 2
    assert "--static" in err


def test_unreadable_pyproject_is_reported(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("= broken")

    code, _, err = _invoke("schedules", "check", "--static", "--project", str(tmp_path))

    assert code == 1
    assert "pyproject.toml" in err


def test_profile_defaults_to_platform_profile() -> None:
    result = CliRunner(env={"PLATFORM_PROFILE": "staging"}).invoke(
        main, ["schedules", "docs", "--project", str(FIXTURES / "alias"), "--format", "json"]
    )

    assert result.exit_code == 0
    assert json.loads(result.stdout)["project"]["state"] == "unknown"


def test_real_console_script_exit_codes() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
    failing = subprocess.run(
        [
            str(SCRIPT),
            "schedules",
            "check",
            "--static",
            "--project",
            str(FIXTURES / "syntax_error"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    passing = subprocess.run(
        [str(SCRIPT), "schedules", "docs", "--format", "json"],
        cwd=FIXTURES / "side_effects",
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )

    assert failing.returncode == 1
    assert "error: beat_schedules/broken.py: syntax error at line 3" in failing.stderr
    assert passing.returncode == 0, passing.stderr
    assert passing.stdout == (GOLDEN / "side_effects.json").read_text()
    assert not (FIXTURES / "side_effects" / "beat_schedules" / "JOB_IMPORTED").exists()
