"""How the suite's tests are cut into xdist work units: one per test file, one for RabbitMQ.

pytest-xdist's ``--dist loadgroup`` groups tests by an ``@group`` suffix it appends to each
node id (``item._nodeid``); since pytest 9 a node id is computed from ``item._id`` and the
suffix never reaches the scheduler, so every test became a unit of its own: a module's
fixtures started in both processes and both started a RabbitMQ node. The scheduler below
cuts the units itself from the node ids it receives, so the grouping does not depend on
either library's internals:

- a test file is one unit (its tests run in order in one process; its module fixtures
  start once);
- every test of a file that names the RabbitMQ fixtures is in one unit, whatever its
  file: a node costs many seconds of CPU to start, and each process that needs one starts
  its own.

The controller process sees node ids only, not fixtures, so a file's RabbitMQ membership
is read from its text (or its folder's ``conftest.py``);
:func:`check_rabbitmq_membership` runs in each xdist worker, where fixtures are known, and
stops the run if the two ever disagree.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

RABBITMQ_UNIT = "rabbitmq"
"""The work unit of every test file that uses the session's RabbitMQ node."""
RABBITMQ_FIXTURES = ("rabbitmq_server", "rabbitmq_url")


@cache
def file_uses_rabbitmq(root: Path, relative: str) -> bool:
    """Whether a test file (or a ``conftest.py`` between it and ``tests/``) names a
    RabbitMQ fixture."""
    path = root / relative
    tests = root / "tests"  # its conftest.py defines the fixtures for every file
    folders = [
        parent for parent in path.parents if parent.is_relative_to(tests) and parent != tests
    ]
    candidates = [path] + [folder / "conftest.py" for folder in folders]
    for candidate in candidates:
        if not candidate.is_file():
            continue
        text = candidate.read_text(encoding="utf-8")
        if any(name in text for name in RABBITMQ_FIXTURES):
            return True
    return False


def unit_of(root: Path, nodeid: str) -> str:
    """The work unit of one test: its file, or the RabbitMQ unit."""
    relative = nodeid.split("::", 1)[0]
    return RABBITMQ_UNIT if file_uses_rabbitmq(root, relative) else relative


class FileUnitScheduling(LoadScopeScheduling):
    """``--dist loadgroup`` with the suite's own units (see the module's docstring)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._root = Path(str(config.rootpath))

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(self._root, nodeid)


def check_rabbitmq_membership(root: Path, items: list[pytest.Item]) -> None:
    """Stop the run if a test uses RabbitMQ (by its fixtures) outside the RabbitMQ unit."""
    for item in items:
        uses = bool(set(RABBITMQ_FIXTURES) & set(getattr(item, "fixturenames", ())))
        relative = item.nodeid.split("::", 1)[0]
        if uses and not file_uses_rabbitmq(root, relative):
            raise pytest.UsageError(
                f"{relative}: {item.name} uses RabbitMQ through a fixture its file does not "
                f"name; name {' or '.join(RABBITMQ_FIXTURES)} in the file so the test runs "
                "in the RabbitMQ work unit (tests/support/work_units.py)"
            )
