"""Helpers for the static job docs tests: fixture projects and reports built from them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from platform_tasks.jobdocs import JobEvidence, Report, build_report, load_docs_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "jobdocs"
GOLDEN = FIXTURES / "golden"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "pyproject.toml").is_file())


def report_for(
    project: Path | str, profile: str = "development", environ: Mapping[str, str] | None = None
) -> Report:
    directory = FIXTURES / project if isinstance(project, str) else project
    return build_report(load_docs_config(directory, profile, environ or {}))


def job_in(report: Report, file: str) -> JobEvidence:
    matches = [job for job in report.jobs if job.file == file]
    assert len(matches) == 1, [job.file for job in report.jobs]
    return matches[0]


@pytest.fixture(autouse=True)
def _no_platform_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads the process environment; the developer's settings must not leak in."""
    import os

    for name in list(os.environ):
        if name.startswith("PLATFORM_"):
            monkeypatch.delenv(name)


@pytest.fixture
def make_project(tmp_path: Path) -> Callable[..., Path]:
    """Write a small project: ``files`` maps relative paths to contents."""

    def make(files: Mapping[str, str], pyproject: str | None = None) -> Path:
        (tmp_path / "pyproject.toml").write_text(
            pyproject
            if pyproject is not None
            else '[tool.platform-tasks.profiles.development]\nredis_url = "redis://r:6379/0"\n'
        )
        for relative, text in files.items():
            path = tmp_path / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return tmp_path

    return make


JOB = (
    "from platform_tasks.jobs import define_job\n\n"
    "def run(ctx):\n    pass\n\n"
    "define_job(handler=run, {args})\n"
)


def job_source(args: str) -> str:
    return JOB.format(args=args)
