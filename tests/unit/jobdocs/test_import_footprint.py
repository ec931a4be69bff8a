"""The static commands load neither Celery nor the broker and database drivers, nor
Sentry or the runtime settings.

``jobs docs``/``check --static`` must run in CI without services or secrets, and quickly;
that holds only while the package and the CLI import those libraries on demand. Each
case runs the real command in a fresh interpreter and inspects ``sys.modules`` after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import platform_tasks
import platform_tasks.jobs
from tests.unit.jobdocs.conftest import FIXTURES

HEAVY = ("celery", "kombu", "redis", "psycopg2", "sentry_sdk", "pydantic_settings")

CHILD = """
import json, sys
from platform_tasks.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})), file=sys.stderr)
"""

COMMANDS = {
    "docs": ["schedules", "docs", "--format", "json", "--output", "{out}"],
    "check": ["schedules", "check", "--static"],
    "old docs": ["jobs", "docs", "--format", "json", "--output", "{out}"],
}


def _loaded_after(command: list[str], cwd: Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("library", HEAVY)
def test_static_command_does_not_import(command: str, library: str, tmp_path: Path) -> None:
    args = [arg.format(out=tmp_path / "jobs.json") for arg in COMMANDS[command]]

    loaded = _loaded_after(args, FIXTURES / "constants")

    assert "platform_tasks" in loaded
    assert library not in loaded


def test_importing_the_package_loads_no_celery() -> None:
    code = "import sys, platform_tasks; print(sorted(m for m in sys.modules if m == 'celery'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("name", platform_tasks.__all__)
def test_every_public_name_imports_from_the_package(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"from platform_tasks import {name}; print({name}.__name__)"],
        capture_output=True,
        text=True,
        check=True,
    )

    assert done.stdout.strip() == name


@pytest.mark.parametrize("name", platform_tasks.jobs.__all__)
def test_every_public_jobs_name_imports_from_the_jobs_package(name: str) -> None:
    code = f"from platform_tasks.jobs import {name}; print({name}.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert done.stdout.strip() == name


def test_the_file_rule_loads_no_runner() -> None:
    # The static reader imports platform_tasks.jobs.selection, which runs jobs/__init__.
    code = (
        "import sys, platform_tasks.jobs.selection; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'redis', 'sentry_sdk', "
        "'pydantic_settings'} or m == 'platform_tasks.jobs.runner'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert done.stdout.strip() == "[]"


def test_unknown_names_and_submodules_behave_as_before() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = platform_tasks.nothing_here
    from platform_tasks import errors  # a submodule, not a lazy name

    assert platform_tasks.PlatformError is errors.PlatformError
    assert set(platform_tasks.__all__) <= set(dir(platform_tasks))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = platform_tasks.jobs.nothing_here
    from platform_tasks.jobs import definition  # a submodule, not a lazy name

    assert platform_tasks.jobs.define_job is definition.define_job
    assert set(platform_tasks.jobs.__all__) <= set(dir(platform_tasks.jobs))
