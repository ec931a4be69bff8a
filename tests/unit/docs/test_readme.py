"""The README is one screen that holds: the two commands first, CI's command, and an
example whose consumer declares and whose scheduled job is discovered as written.

The example runs in a child process: ``create_app`` makes its app Celery's current one,
which must not leak into the other tests of this process.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


def test_the_two_commands_come_first_and_ci_runs_make_test() -> None:
    commands = re.findall(r"```sh\n(.*?)```", README, re.S)
    assert [c.strip() for c in commands[:1]] == ["make run"], commands
    assert "make test" in [c.strip() for c in commands], commands
    assert README.index("make run") < README.index("make test")
    assert "CI runs exactly this command (`.ci/run`)" in README
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == "make test", ci


def test_the_example_declares_its_consumer_and_its_job_as_written(tmp_path: Path) -> None:
    consumer, job = re.findall(r"```python\n(.*?)```", README, re.S)[:2]
    declaration, marker, _publish = consumer.partition("# anywhere in the application:")
    assert marker, "the README example publishes a job"
    first_line, _, _ = job.partition("\n")
    relative = first_line.removeprefix("# ").split()[0]
    assert relative == "beat_schedules/billing/nightly.py", first_line
    (tmp_path / relative).parent.mkdir(parents=True)
    (tmp_path / relative).write_text(job)
    (tmp_path / "celery_app.py").write_text(declaration)
    check = textwrap.dedent(
        """
        from datetime import UTC, datetime
        from pathlib import Path

        from celery_app import app
        from platform_tasks.consumer.task import PlatformTask
        from platform_tasks.jobs.discovery import discover_jobs

        task = app.tasks["billing.charge_invoice"]
        assert isinstance(task, PlatformTask), type(task)
        assert task.data_model.__name__ == "ChargeInvoice"
        jobs = discover_jobs(Path("beat_schedules"), now=datetime.now(UTC))
        print(sorted(j.name for j in jobs), jobs.jobs[0].definition.cron)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", check],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "['billing.nightly'] 30 2 * * *", result.stdout
