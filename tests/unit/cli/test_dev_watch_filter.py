"""Which changes under the jobs folder restart ``platform-tasks dev``."""

from __future__ import annotations

from platform_tasks.cli.devserver import definition_changes


def test_bytecode_written_by_the_restarted_processes_does_not_restart_again() -> None:
    changed = {
        "/p/beat_schedules/hello.py",
        "/p/beat_schedules/__pycache__",
        "/p/beat_schedules/__pycache__/hello.cpython-311.pyc",
        "/p/beat_schedules/billing/__pycache__/nightly.cpython-311.pyc.1234",
        "/p/beat_schedules/hello.py~",
    }
    assert definition_changes(changed) == {"/p/beat_schedules/hello.py"}


def test_any_other_file_counts() -> None:
    changed = {"/p/beat_schedules/_common.py", "/p/beat_schedules/NOTES.md"}
    assert definition_changes(changed) == changed
