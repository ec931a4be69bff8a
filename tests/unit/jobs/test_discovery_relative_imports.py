"""A relative import in a job file fails discovery with an error that says why.

Discovery imports each job file on its own under a generated module name, so
``from ._common import X`` cannot work; the error names the file and the line and
says what to write instead, rather than Python's "No module named '_platform_jobs_…'".
The static ``jobs check --static`` reports the same files as errors.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from platform_tasks.errors import JobDefinitionError
from platform_tasks.jobs.discovery import discover_jobs

NOW = datetime(2024, 1, 1, tzinfo=UTC)

DEFINITION = """
from platform_tasks.jobs import define_job


def run(ctx):
    pass


define_job(handler=run, cron=NIGHTLY)
"""


def _project(tmp_path: Path, relative: str, import_line: str) -> Path:
    root = tmp_path / "beat_schedules"
    (root / "billing").mkdir(parents=True)
    (root / "_common.py").write_text('NIGHTLY = "0 3 * * *"\n')
    (root / "billing" / "_common.py").write_text('NIGHTLY = "0 4 * * *"\n')
    (root / relative).write_text(import_line + "\n" + DEFINITION)
    return root


@pytest.mark.parametrize(
    ("relative", "import_line"),
    [
        ("nightly.py", "from ._common import NIGHTLY"),
        ("nightly.py", "from . import _common\nNIGHTLY = _common.NIGHTLY"),
        ("billing/nightly.py", "from ._common import NIGHTLY"),
        ("billing/nightly.py", "from .._common import NIGHTLY"),
        ("nightly.py", "from .._common import NIGHTLY"),
    ],
)
def test_relative_import_in_a_job_file_is_a_definition_error(
    tmp_path: Path, relative: str, import_line: str
) -> None:
    root = _project(tmp_path, relative, import_line)

    with pytest.raises(JobDefinitionError) as caught:
        discover_jobs(root, now=NOW)

    error = caught.value
    assert error.file == str(root.absolute() / relative)
    assert error.field is None
    assert error.detail.startswith("relative imports are not supported in job files (line 1)")
    assert "from beat_schedules._common import X" in error.detail
    assert "_platform_jobs_" not in str(error)
    assert isinstance(error.__cause__, ImportError)


def test_other_import_errors_keep_the_generic_message(tmp_path: Path) -> None:
    root = _project(tmp_path, "nightly.py", "from no_such_module_here import NIGHTLY")

    with pytest.raises(JobDefinitionError) as caught:
        discover_jobs(root, now=NOW)

    assert caught.value.detail == (
        "importing failed: ModuleNotFoundError: No module named 'no_such_module_here'"
    )
