"""``platform-tasks jobs list`` imports and validates like beat, and shows lease and points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner, Result

from platform_tasks.cli import main

SCRIPT = str(Path(sys.executable).parent / "platform-tasks")

JOB = """
from datetime import timedelta
from platform_tasks.jobs import define_job
def run(ctx): pass
define_job(handler=run, {arguments})
"""

WEEKLY = 'cron="0 9 * * 1", timezone="Europe/Berlin"'


def _job(folder: Path, relative: str, arguments: str) -> None:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(JOB.format(arguments=arguments))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project as the working directory; ``sys.path`` restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in os.environ if n.startswith("PLATFORM_")]:
        monkeypatch.delenv(name)
    return tmp_path


def _invoke(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(main, ["schedules", "list", *args], env=env)


def _json(*args: str, env: dict[str, str | None] | None = None) -> dict[str, dict[str, Any]]:
    result = _invoke("--format", "json", *args, env=env)
    assert result.exit_code == 0, result.output
    return {row["name"]: row for row in json.loads(result.output)}


def test_list_json_shows_lease_and_the_next_three_future_points(project: Path) -> None:
    jobs = project / "beat_schedules"
    _job(jobs, "weekly.py", WEEKLY)
    _job(jobs, "sweep.py", "interval=timedelta(minutes=15)")
    _job(jobs, "leased.py", "interval=timedelta(hours=2), lease_ttl=timedelta(minutes=10)")
    _job(jobs, "off.py", 'cron="0 0 30 2 *", enabled=False')  # never fires: fine, disabled
    before = datetime.now(UTC)

    rows = _json()

    after = datetime.now(UTC)
    assert sorted(rows) == ["leased", "off", "sweep", "weekly"]
    sweep = [datetime.fromisoformat(p) for p in rows["sweep"]["next_points"]]
    assert len(sweep) == 3
    assert before < sweep[0] <= after + timedelta(minutes=15)
    assert [b - a for a, b in pairwise(sweep)] == [timedelta(minutes=15)] * 2
    assert all(point.timestamp() % 900 == 0 for point in sweep)  # aligned to the epoch
    assert rows["sweep"]["next_point"] == rows["sweep"]["next_points"][0]
    weekly = [datetime.fromisoformat(p) for p in rows["weekly"]["next_points"]]
    assert len(weekly) == 3 and before < weekly[0] < weekly[1] < weekly[2]
    for point in weekly:
        local = point.astimezone(ZoneInfo("Europe/Berlin"))
        assert (local.weekday(), local.hour, local.minute) == (0, 9, 0)
    assert rows["off"]["next_points"] == [] and rows["off"]["next_point"] is None
    leases = {name: (row["lease_ttl"], row["lease_ttl_default"]) for name, row in rows.items()}
    assert leases == {
        "weekly": (3600.0, True),  # the period (a week) capped at 1 h
        "sweep": (900.0, True),  # the period
        "leased": (600.0, False),  # as given
        "off": (None, True),  # a cron default needs a point; a disabled job has none
    }
    assert rows["weekly"]["file"] == str(jobs / "weekly.py")
    assert rows["weekly"]["queue"] == "platform.jobs"


def test_list_table_has_every_column(project: Path) -> None:
    _job(
        project / "beat_schedules",
        "billing/leased.py",
        "interval=timedelta(hours=2), lease_ttl=timedelta(minutes=10)",
    )
    _job(project / "beat_schedules", "weekly.py", WEEKLY + ", enabled=False")

    result = _invoke()

    assert result.exit_code == 0, result.output
    header, *lines = result.output.splitlines()
    assert header.split() == [
        "NAME",
        "SCHEDULE",
        "TIMEZONE",
        "ENABLED",
        "LEASE",
        "NEXT",
        "3",
        "POINTS",
        "(UTC)",
        "FILE",
    ]
    leased, weekly = lines
    cells = leased.split()
    assert cells[:6] == ["billing.leased", "every", "2:00:00", "UTC", "yes", "10m"]
    assert cells[-1] == "beat_schedules/billing/leased.py"
    points = [
        datetime.fromisoformat(f"{d} {t.rstrip(',')}+00:00")
        for d, t in zip(cells[6:-1:2], cells[7:-1:2], strict=True)
    ]
    assert len(points) == 3 and points == sorted(points)
    assert all(point.timestamp() % 7200 == 0 for point in points)
    assert weekly.split() == [
        "weekly",
        "0",
        "9",
        "*",
        "*",
        "1",
        "Europe/Berlin",
        "no",
        "-",
        "-",
        "beat_schedules/weekly.py",
    ]


PYPROJECT = """\
[tool.platform-tasks]
jobs_dir = "dev_jobs"

[tool.platform-tasks.profiles.production]
jobs_dir = "prod_jobs"
jobs_exclude = ["legacy/*"]

[tool.platform-tasks.profiles.paused]
jobs_dir = "prod_jobs"
jobs_enabled = false

[tool.platform-tasks.profiles.broken]
jobs_dir = "prod_jobs"
redis_url = "not a url"
"""


@pytest.fixture
def profiles(project: Path) -> Path:
    (project / "pyproject.toml").write_text(PYPROJECT)
    _job(project / "dev_jobs", "dev_only.py", WEEKLY)
    _job(project / "prod_jobs", "prod_only.py", WEEKLY)
    _job(project / "prod_jobs", "legacy/old.py", WEEKLY)
    return project


def test_profile_selects_its_pyproject_settings(profiles: Path) -> None:
    assert list(_json()) == ["dev_only"]  # no profile: development, the tool table
    assert list(_json("--profile", "production")) == ["prod_only"]
    assert list(_json(env={"PLATFORM_PROFILE": "production"})) == ["prod_only"]
    assert list(_json("--profile", "production", env={"PLATFORM_PROFILE": "paused"})) == [
        "prod_only"
    ]


def test_environment_wins_over_pyproject(profiles: Path) -> None:
    env: dict[str, str | None] = {"PLATFORM_JOBS_EXCLUDE": "nothing/*"}

    assert sorted(_json("--profile", "production", env=env)) == ["legacy.old", "prod_only"]


def test_profile_switching_jobs_off(profiles: Path) -> None:
    assert _json("--profile", "paused") == {}
    result = _invoke("--profile", "paused")
    assert result.exit_code == 0, result.output
    assert result.output == "scheduled jobs are disabled (jobs_enabled=false, profile 'paused')\n"


def test_bad_profile_setting_names_profile_and_variable(profiles: Path) -> None:
    result = _invoke("--profile", "broken")

    assert result.exit_code == 1
    assert "profile 'broken'" in result.output and "PLATFORM_REDIS_URL" in result.output


def test_list_fails_naming_the_file(project: Path) -> None:
    _job(project / "beat_schedules", "bad.py", 'cron="0 0 30 2 *"')
    result = _invoke()
    assert result.exit_code == 1
    assert "bad.py" in result.output and "cron" in result.output


def test_relative_import_is_reported_as_such(project: Path) -> None:
    jobs = project / "beat_schedules"
    jobs.mkdir()
    (jobs / "_common.py").write_text('NIGHTLY = "0 3 * * *"\n')
    (jobs / "nightly.py").write_text(
        "from ._common import NIGHTLY\n" + JOB.format(arguments="cron=NIGHTLY")
    )

    result = _invoke()

    assert result.exit_code == 1
    assert f"file {jobs / 'nightly.py'}" in result.output
    assert "relative imports are not supported in job files (line 1)" in result.output


def test_job_files_import_from_the_project_like_under_celery(tmp_path: Path) -> None:
    # The console script, with no PYTHONPATH: the working directory is on sys.path.
    jobs = tmp_path / "beat_schedules"
    jobs.mkdir()
    (jobs / "_common.py").write_text('NIGHTLY = "0 3 * * *"\n')
    (jobs / "nightly.py").write_text(
        "from beat_schedules._common import NIGHTLY\n" + JOB.format(arguments="cron=NIGHTLY")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLATFORM_", "PYTHONPATH"))}

    done = subprocess.run(
        [SCRIPT, "schedules", "list", "--format", "json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert (row["name"], row["schedule"]) == ("nightly", "0 3 * * *")
