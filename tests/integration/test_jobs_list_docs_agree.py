"""``platform-tasks jobs list`` (imports the job files) and ``jobs docs`` (reads them) agree.

Both commands run as real subprocesses on a project where every field is statically
known: cron and interval jobs, a disabled one, explicit and default names, leases and
queues, and a cron and a zone resolved from ``beat_schedules/_common.py``.

``jobs list`` runs with the project directory on ``PYTHONPATH``: the job files import
``beat_schedules._common`` by absolute name, which beat and the workers resolve because
``celery -A celery_app`` puts the working directory on ``sys.path``.
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


def _environment(project: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(project), env.get("PYTHONPATH")) if p)
    return env


def _run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *args], cwd=project, env=_environment(project),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


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
    done = _run(project, "jobs", "list", "--format", "json")
    assert done.returncode == 0, done.stderr
    rows = {}
    for row in json.loads(done.stdout):
        rows[row["name"]] = {
            "file": Path(row["file"]).resolve(),
            "schedule": row["schedule"],
            "timezone": row["timezone"],
            "enabled": row["enabled"],
            "queue": row["queue"],
        }
    return rows


def _static_view(project: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    done = _run(project, "jobs", "docs", "--format", "json")
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
        documented = {k: v for k, v in static[name].items() if k != "lease_ttl"}
        assert documented == listed, name
    assert runtime["nightly"]["schedule"] == "30 2 * * *"  # the constant from _common
    assert runtime["nightly"]["timezone"] == "Europe/Berlin"
    assert runtime["reports.legacy_export"]["enabled"] is False
    assert document["runtime_verified"] is False
    assert document["files_without_evidence"] == []


def _runtime_leases(project: Path) -> dict[str, dict[str, Any]]:
    """Each job's lease as the runtime holds it: the ``lease_ttl`` given (or ``None``) and
    the running lease of its next point. ``jobs list`` prints no lease, so this asks the
    public discovery function, in a subprocess like the commands."""
    code = """
import json
from datetime import UTC, datetime
from pathlib import Path
from platform_tasks.jobs.discovery import discover_jobs
now = datetime.now(UTC)
print(json.dumps({
    job.name: {
        "given": job.definition.lease_ttl and job.definition.lease_ttl.total_seconds(),
        "cron": job.definition.cron,
        "running": job.schedule.lease_ttl_for(job.schedule.next_after(now)).total_seconds(),
    }
    for job in discover_jobs(Path("beat_schedules"), now=now)
}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=_environment(project),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    leases: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return leases


def test_list_and_docs_agree_on_leases(project: Path) -> None:
    runtime = _runtime_leases(project)
    static, _ = _static_view(project)

    assert sorted(runtime) == sorted(static)
    for name, lease in runtime.items():
        documented = static[name]["lease_ttl"]
        if lease["given"] is not None or lease["cron"] is None:
            # Given, or the interval default (the period capped at 1 h): the same number.
            assert documented == lease["running"], name
        else:
            # A cron job's default depends on the point; the reader says so (no value).
            assert documented is None, name
    assert runtime["billing.invoices"]["running"] == 600.0
    assert runtime["reports.hourly"]["running"] == 1800.0
    assert runtime["billing.sweep"]["running"] == 900.0


def test_a_job_file_runtime_cannot_import_fails_both(project: Path) -> None:
    # Discovery imports a job file under a generated name outside any package, so a
    # relative import fails at start-up; the static check must fail on it too.
    (project / "beat_schedules" / "relative.py").write_text(
        "from ._common import NIGHTLY\n"
        "from platform_tasks.jobs import define_job\n"
        + HANDLER
        + "define_job(handler=run, cron=NIGHTLY)\n"
    )

    listed = _run(project, "jobs", "list", "--format", "json")
    checked = _run(project, "jobs", "check", "--static")

    assert listed.returncode == 1
    assert "relative.py" in listed.stderr + listed.stdout
    assert checked.returncode == 1
    assert "error: beat_schedules/relative.py: relative import at line 1" in checked.stderr
