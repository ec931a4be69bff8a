"""The job-testing example of the README runs as written."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT

JOB = """
from platform_tasks.jobs import define_job

def run(ctx):
    ctx.logger.info("nightly ran for %s", ctx.scheduled_for)

job = define_job(handler=run, cron="30 2 * * *", timezone="Europe/Berlin")
"""


@pytest.fixture
def job_scheduler_redis_url(redis_url: str) -> str:
    return redis_url


def test_readme_job_testing_example(
    job_scheduler: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "beat_schedules" / "billing").mkdir(parents=True)
    (tmp_path / "beat_schedules" / "billing" / "nightly.py").write_text(JOB)
    monkeypatch.chdir(tmp_path)
    readme = (REPO_ROOT / "README.md").read_text()
    example = re.search(r"def test_nightly_runs_once_at_its_point.*?```", readme, re.S)
    assert example, "the README example is gone"
    source = "from datetime import UTC, datetime\n" + example.group(0).removesuffix("```")
    namespace: dict[str, Any] = {}
    exec(compile(source, "README.md", "exec"), namespace)
    namespace["test_nightly_runs_once_at_its_point"](job_scheduler)
