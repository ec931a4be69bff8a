"""The absolute import the docs recommend works when the worker discovers its jobs.

``celery -A celery_app worker`` puts the working directory on ``sys.path`` only while it
imports the app; discovery runs later, in a worker bootstep. A job file that shares a
helper through ``from beat_schedules._common import X`` must still import there, from
any working directory, so discovery makes the folder that holds the jobs folder
importable. Run in a fresh interpreter whose working directory is elsewhere, so nothing
of this test's own ``sys.path`` helps.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from platform_tasks.jobs.discovery import discover_jobs
jobs = discover_jobs(Path(sys.argv[1]), now=datetime(2024, 1, 1, tzinfo=UTC))
print(sorted(job.name for job in jobs))
"""


def test_a_job_file_imports_a_helper_of_its_jobs_folder(tmp_path: Path) -> None:
    project = tmp_path / "project"
    root = project / "shared_schedules_pkg"
    root.mkdir(parents=True)
    (root / "_common.py").write_text('NIGHTLY = "0 3 * * *"\n')
    (root / "nightly.py").write_text(
        "from platform_tasks.jobs import define_job\n"
        "from shared_schedules_pkg._common import NIGHTLY\n\n\n"
        "def run(ctx):\n    pass\n\n\n"
        "define_job(handler=run, cron=NIGHTLY)\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['nightly']"
