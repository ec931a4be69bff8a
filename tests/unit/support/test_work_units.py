"""The suite's xdist work units: one per test file, one for every file that uses RabbitMQ."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.work_units import RABBITMQ_UNIT, FileUnitScheduling, unit_of

ROOT = Path(__file__).resolve().parents[3]


def test_a_file_is_its_own_unit_and_files_naming_rabbitmq_share_one() -> None:
    plain = "tests/e2e/consumer/test_time_limits.py::test_x"
    assert unit_of(ROOT, plain) == "tests/e2e/consumer/test_time_limits.py"
    # named in the file itself, and through its folder's conftest.py only
    assert unit_of(ROOT, "tests/integration/notifications/test_marketing_yield.py::t") == (
        RABBITMQ_UNIT
    )
    assert unit_of(ROOT, "tests/e2e/brokers/rabbitmq/test_rabbitmq_beat.py::t") == RABBITMQ_UNIT


def test_the_suite_runs_under_its_own_scheduler(pytestconfig: pytest.Config) -> None:
    """pytest-xdist's own group suffix is lost since pytest 9: the hook must supply ours."""
    scheduler = pytestconfig.hook.pytest_xdist_make_scheduler(config=pytestconfig, log=None)
    if pytestconfig.getvalue("dist") == "loadgroup":
        assert isinstance(scheduler, FileUnitScheduling)
        assert scheduler._split_scope("tests/unit/test_epoch.py::test_a") == (
            "tests/unit/test_epoch.py"
        )
    else:  # -n 0: no scheduler at all
        assert scheduler is None
