"""``platform-tasks jobs list`` (imports the job files) and ``jobs docs`` (reads them) agree.

Both commands run as real subprocesses on a project where every field is statically
known: cron and interval jobs, a disabled one, explicit and default names, leases and
queues, and a cron and a zone resolved from ``beat_schedules/_common.py``.

The job files import ``beat_schedules._common`` by absolute name: ``jobs list`` puts the
working directory on ``sys.path`` as ``celery -A celery_app`` does for beat and the
workers, so both commands run with no ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

SCRIPT = str(Path(sys.executable).parent / "platform-tasks")

PYPROJECT = """\
[tool.platform-tasks]
source_roots = ["beat_schedules"]

[tool.platform-tasks.profiles.development]
redis_url = "redis://127.0.0.1:6379/0"
"""

HEADER = "from datetime import timedelta\n\nfrom platform_tasks.jobs import define_job\n"
COMMON_IMPORT = "from beat_schedules._common import NIGHTLY, ZONE\n"
HANDLER = "\n\ndef run(ctx):\n    pass\n\n\n"

JOBS = {
    "nightly.py": COMMON_IMPORT + "define_job(handler=run, cron=NIGHTLY, timezone=ZONE)",
    "billing/invoices.py": 'define_job(handler=run, cron="*/15  8-18 * * 1-5", '
    'name="billing.invoices", lease_ttl=timedelta(minutes=10), queue="billing.jobs")',
    "billing/sweep.py": "define_job(handler=run, interval=timedelta(minutes=15))",
    "reports/hourly.py": "define_job(handler=run, interval=timedelta(hours=2), "
    "lease_ttl=timedelta(minutes=30))",
    "reports/legacy.py": COMMON_IMPORT + "define_job(handler=run, cron=NIGHTLY, "
    'timezone="America/New_York", enabled=False, name="reports.legacy_export")',
    "_internal/heartbeat.py": "define_job(handler=run, interval=timedelta(seconds=30), "
    "enabled=True)",
}


def _environment() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_") and k != "PYTHONPATH"
    }


def _run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *args],
        cwd=project,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    jobs = tmp_path / "beat_schedules"
    jobs.mkdir()
    (jobs / "_common.py").write_text('NIGHTLY = "30 2 * * *"\nZONE = "Europe/Berlin"\n')
    for relative, call in JOBS.items():
        path = jobs / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        imports, _, definition = call.rpartition("\n")
        path.write_text(HEADER + imports + HANDLER + definition + "\n")
    return tmp_path


def _runtime_view(project: Path) -> dict[str, dict[str, Any]]:
    done = _run(project, "schedules", "list", "--format", "json")
    assert done.returncode == 0, done.stderr
    rows = {}
    for row in json.loads(done.stdout):
        rows[row["name"]] = {
            "file": Path(row["file"]).resolve(),
            "schedule": row["schedule"],
            "timezone": row["timezone"],
            "enabled": row["enabled"],
            "queue": row["queue"],
            "lease_ttl": row["lease_ttl"],
            "lease_ttl_default": row["lease_ttl_default"],
        }
    return rows


def _static_view(project: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    done = _run(project, "schedules", "docs", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", "a fully known project has no missing evidence"
    document = json.loads(done.stdout)
    jobs = {}
    for job in document["jobs"]:
        assert job["evidence"] == "complete", job
        fields = {name: field["value"] for name, field in job["fields"].items()}
        if fields["cron"] is not None:
            schedule = " ".join(fields["cron"].split())  # define_job normalises spacing
        else:
            schedule = f"every {timedelta(seconds=fields['interval'])}"
        jobs[fields["name"]] = {
            "file": (project / job["file"]).resolve(),
            "schedule": schedule,
            "timezone": fields["timezone"],
            "enabled": fields["enabled"],
            "queue": fields["queue"],
            "lease_ttl": fields["lease_ttl"],
            "is_cron": fields["cron"] is not None,
        }
    return jobs, document


def test_list_and_docs_agree_on_every_job(project: Path) -> None:
    runtime = _runtime_view(project)
    static, document = _static_view(project)

    assert (
        sorted(runtime)
        == sorted(static)
        == [
            "_internal.heartbeat",
            "billing.invoices",
            "billing.sweep",
            "nightly",
            "reports.hourly",
            "reports.legacy_export",
        ]
    )
    for name, listed in runtime.items():
        compared = ("file", "schedule", "timezone", "enabled", "queue")
        assert {k: static[name][k] for k in compared} == {k: listed[k] for k in compared}, name
    assert runtime["nightly"]["schedule"] == "30 2 * * *"  # the constant from _common
    assert runtime["nightly"]["timezone"] == "Europe/Berlin"
    assert runtime["reports.legacy_export"]["enabled"] is False
    assert document["runtime_verified"] is False
    assert document["files_without_evidence"] == []


def test_list_and_docs_agree_on_leases(project: Path) -> None:
    runtime = _runtime_view(project)
    static, _ = _static_view(project)

    assert sorted(runtime) == sorted(static)
    for name, listed in runtime.items():
        documented = static[name]["lease_ttl"]
        if not listed["lease_ttl_default"] or not static[name]["is_cron"]:
            # Given, or the interval default (the period capped at 1 h): the same number.
            assert documented == listed["lease_ttl"], name
        else:
            # A cron job's default depends on the point; the reader says so (no value).
            assert documented is None, name
    assert runtime["billing.invoices"]["lease_ttl"] == 600.0
    assert runtime["billing.invoices"]["lease_ttl_default"] is False
    assert runtime["reports.hourly"]["lease_ttl"] == 1800.0
    assert runtime["billing.sweep"]["lease_ttl"] == 900.0
    assert runtime["billing.sweep"]["lease_ttl_default"] is True
    assert runtime["_internal.heartbeat"]["lease_ttl"] == 30.0
    assert runtime["nightly"]["lease_ttl"] == 3600.0  # a day, capped at 1 h


def test_a_job_file_runtime_cannot_import_fails_both(project: Path) -> None:
    # Discovery imports a job file under a generated name outside any package, so a
    # relative import fails at start-up; the static check must fail on it too.
    (project / "beat_schedules" / "relative.py").write_text(
        "from ._common import NIGHTLY\n"
        "from platform_tasks.jobs import define_job\n"
        + HANDLER
        + "define_job(handler=run, cron=NIGHTLY)\n"
    )

    listed = _run(project, "schedules", "list", "--format", "json")
    checked = _run(project, "schedules", "check", "--static")

    assert listed.returncode == 1
    assert "relative.py" in listed.stderr
    assert "relative imports are not supported in job files (line 1)" in listed.stderr
    assert checked.returncode == 1
    assert "error: beat_schedules/relative.py: relative import at line 1" in checked.stderr
