"""The source index walks the roots once; the job selection may reuse that walk."""

from __future__ import annotations

from pathlib import Path

from platform_tasks.jobdocs.sources import SourceIndex
from platform_tasks.jobs.selection import select_job_files, select_job_paths

TREE = [
    "beat_schedules/a.py",
    "beat_schedules/_common.py",
    "beat_schedules/notes.txt",
    "beat_schedules/team/b.py",
    "beat_schedules/team/__init__.py",
    "beat_schedules/team/deep/c.py",
    "beat_schedules/team/test_c.py",
    "beat_schedules/.hidden/d.py",
    "beat_schedules/__pycache__/e.py",
    "beat_schedules/_private/f.py",
    "other/g.py",
]


def _tree(tmp_path: Path) -> Path:
    for relative in TREE:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n")
    return tmp_path


def test_a_roots_listing_is_what_the_selection_would_walk(tmp_path: Path) -> None:
    project = _tree(tmp_path)
    jobs = project / "beat_schedules"
    index = SourceIndex(project, [jobs, project / "other"])

    listed = index.python_files(jobs)

    assert listed is not None
    assert sorted(listed) == [
        "_common.py",
        "_private/f.py",
        "a.py",
        "team/__init__.py",
        "team/b.py",
        "team/deep/c.py",
        "team/test_c.py",
    ]
    for include, exclude in [((), ()), (("team/*",), ()), ((), ("*deep*",))]:
        reused = select_job_paths(jobs, include, exclude, candidates=listed)
        assert reused == [str(p) for p in select_job_files(jobs, include, exclude)]


def test_a_directory_that_is_not_a_root_has_no_listing(tmp_path: Path) -> None:
    project = _tree(tmp_path)
    index = SourceIndex(project, [project / "beat_schedules"])

    assert index.python_files(project / "beat_schedules" / "team") is None
    assert index.python_files(project / "other") is None
