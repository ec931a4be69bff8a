"""A temporary user project with job files and tests, run by a real ``pytest`` process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CONFTEST = """
import pytest

@pytest.fixture
def job_scheduler_redis_url():
    return {url!r}
"""


def write_project(
    root: Path,
    *,
    redis_url: str,
    jobs: dict[str, str],
    tests: dict[str, str],
    jobs_folder: str = "beat_schedules",
) -> Path:
    """``root`` with ``<jobs_folder>/...`` job files, a conftest naming the test Redis and
    the test modules; returns ``root``."""
    for relative, source in jobs.items():
        path = root / jobs_folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    (root / "conftest.py").write_text(CONFTEST.format(url=redis_url))
    for name, source in tests.items():
        (root / name).write_text(textwrap.dedent(source))
    return root


@dataclass(frozen=True)
class PytestOutcome:
    passed: int
    failed: int
    errors: int
    output: str


def _count(output: str, word: str) -> int:
    found = re.search(rf"(\d+) {word}", output.strip().splitlines()[-1] if output.strip() else "")
    return int(found.group(1)) if found else 0


def run_pytest(
    project: Path, *, env: dict[str, str] | None = None, args: Sequence[str] = ()
) -> PytestOutcome:
    """``python -m pytest -q`` in ``project`` with a user's environment (no PLATFORM_*
    unless ``env`` adds some) and the extra command-line ``args``; the plugin comes from
    the installed entry point."""
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("PLATFORM_", "PYTEST_", "SENTRY_"))
    }
    environment.pop("PYTHONPATH", None)
    environment.update(env or {})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "error",
            *args,
            "--rootdir",
            str(project),
            str(project),
        ],
        cwd=project,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    return PytestOutcome(
        _count(output, "passed"), _count(output, "failed"), _count(output, "error"), output
    )
