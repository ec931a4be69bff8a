"""The documented ways to run the platform start workers as a user would: no ``-Q``/``-X``.

A worker narrowed to some queues would leave scheduled-job triggers (``platform.jobs``)
unconsumed; ``make run`` (``platform-tasks dev``), docker-compose, the README and the pages
of docs/ must not narrow it.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from platform_tasks.cli.devserver import DevOptions, DevPlatform
from tests.conftest import REPO_ROOT

NARROWING = {"-Q", "--queues", "-X", "--exclude-queues"}


def _narrows(argv: list[str]) -> bool:
    prefixes = ("--queues=", "--exclude-queues=")
    return any(arg in NARROWING or arg.startswith(prefixes) for arg in argv)


def test_dev_platform_starts_plain_workers_and_beat(tmp_path: Path) -> None:
    options = DevOptions(
        app="celery_app",
        project_dir=tmp_path,
        data_dir=tmp_path,
        flower_port=0,
        beat_replicas=2,
        samples=0,
        jobs_dir=tmp_path,
    )
    platform = DevPlatform(options, say=lambda line: None)
    worker, beat = platform.worker_argv(), platform.beat_argv()
    assert worker[1:4] == ["-A", "celery_app", "worker"] and not _narrows(worker)
    assert beat[1:4] == ["-A", "celery_app", "beat"] and not _narrows(beat)


def test_compose_services_and_dockerfile_start_plain_workers() -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    commands = {name: service.get("command") for name, service in compose["services"].items()}
    assert commands["worker"][:4] == ["celery", "-A", "celery_app", "worker"]
    for name, command in commands.items():
        if command and command[:1] == ["celery"]:
            assert not _narrows(command), (name, command)
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert not re.search(r"\s(-Q|-X|--queues|--exclude-queues)\b", dockerfile)


def test_readme_and_docs_commands_do_not_narrow_workers() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert re.findall(r"celery -A \S+ worker[^\n`]*", readme), "the README starts a worker"
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    for page in pages:
        for command in re.findall(r"celery -A \S+ worker[^\n`]*", page.read_text()):
            assert not _narrows(command.split("#")[0].split()), (page.name, command)
