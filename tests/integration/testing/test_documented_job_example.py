"""The job-testing example of docs/scheduled-jobs.md runs as written, in a real pytest run.

A temporary project holds ``beat_schedules/billing/nightly.py``, a ``conftest.py`` that
points the plugin at the suite's Redis (as a user's conftest would point at theirs) and
a test module that is the page's code block, verbatim. ``pytest`` runs in a subprocess
with the plugin loaded through its entry point, as in a user's project.
"""

from __future__ import annotations

import re
from pathlib import Path

import redis

from tests.conftest import REPO_ROOT
from tests.integration.testing.pytest_project import run_pytest, write_project

JOB = """
from platform_tasks.jobs import define_job

def run(ctx):
    ctx.logger.info("nightly ran for %s", ctx.scheduled_for)

job = define_job(handler=run, cron="30 2 * * *", timezone="Europe/Berlin")
"""


def documented_example() -> str:
    guide = (REPO_ROOT / "docs" / "scheduled-jobs.md").read_text()
    block = re.search(
        r"```python\n(from datetime import UTC, datetime\n\ndef test_nightly_runs_once.*?)```",
        guide,
        re.S,
    )
    assert block, "the job-testing example of docs/scheduled-jobs.md is gone"
    return block.group(1)


def test_the_documented_job_testing_example_passes_as_written(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    project = write_project(
        tmp_path,
        redis_url=redis_url,
        jobs={"billing/nightly.py": JOB},
        tests={"test_documented.py": documented_example()},
    )
    outcome = run_pytest(project)
    assert outcome.passed == 2 and outcome.failed == 0, outcome.output
    assert redis_client.keys("*") == [], "the fixtures delete their keys"
